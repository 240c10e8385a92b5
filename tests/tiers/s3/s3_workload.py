"""Manager-level helpers shared by the object store tests and their second process."""

from __future__ import annotations

import time
from collections.abc import Sequence

from kvtier import RETRY, ChunkKey, TieringManager
from tests.conftest import fill, holds

BOUND_S = 20.0  # a generous multiple of the tiers' timeout_s in these tests


def store(manager: TieringManager, keys: Sequence[ChunkKey]) -> None:
    """Write ``keys`` into host (their test pattern) and wait until every tier has them."""
    plan = manager.prepare_store(keys)
    assert plan is not None
    for key, slot in zip(plan.keys, plan.slots, strict=True):
        fill(manager.region, slot, key)
    manager.complete_store(plan.keys)
    assert manager.wait_idle(BOUND_S), "a store job hung"


def settle(manager: TieringManager, keys: Sequence[ChunkKey], timeout: float = BOUND_S) -> int:
    """Ask ``lookup`` until it stops answering RETRY; returns the leading chunks ready."""
    deadline = time.monotonic() + timeout
    while (ready := manager.lookup(keys)) is RETRY:
        assert time.monotonic() < deadline, "lookup kept answering RETRY"
        time.sleep(0.005)
    assert isinstance(ready, int)
    return ready


def served_intact(manager: TieringManager, keys: Sequence[ChunkKey]) -> bool:
    """Every key becomes ready in host, holding exactly the bytes stored for it."""
    ready = settle(manager, keys)
    slots = manager.prepare_load(keys[:ready])
    intact = all(holds(manager.region, s, k) for s, k in zip(slots, keys, strict=False))
    manager.complete_load(keys[:ready])
    return ready == len(keys) and intact
