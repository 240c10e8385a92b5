"""Shared fixtures: a small layout, its identity, and helpers to fill and check host slots."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pytest

from kvtier import CacheIdentity, ChunkKey, KVLayout, TieringConfig, chunk_keys
from kvtier.region import HostRegion
from kvtier.tiers.base import RETRY, JobResult, Lookup, SecondaryTier

SMALL_LAYOUT = KVLayout(
    num_layers=2, num_kv_heads=2, head_dim=16, dtype="float32", block_size=4, blocks_per_chunk=2
)


@pytest.fixture
def layout() -> KVLayout:
    return SMALL_LAYOUT


@pytest.fixture
def identity(layout: KVLayout) -> CacheIdentity:
    return CacheIdentity(model="test/model", revision="r1", layout=layout)


def make_keys(identity: CacheIdentity, n: int, seed: int = 0) -> list[ChunkKey]:
    per_chunk = identity.layout.tokens_per_chunk
    tokens = np.random.default_rng(seed).integers(0, 50_000, size=n * per_chunk)
    return chunk_keys(tokens, identity)


def chunk_pattern(key: bytes, size: int) -> bytes:
    """Deterministic, key-specific bytes for a chunk of ``size`` bytes."""
    seed = int.from_bytes(key[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8).tobytes()


def fill(region: HostRegion, slot: int, key: bytes) -> None:
    region.view(slot)[:] = chunk_pattern(key, region.slot_bytes)


def holds(region: HostRegion, slot: int, key: bytes) -> bool:
    return bytes(region.view(slot)) == chunk_pattern(key, region.slot_bytes)


def config(cpu_slots: int, layout: KVLayout = SMALL_LAYOUT, **extra: object) -> TieringConfig:
    stride = -(-layout.chunk_bytes // 4096) * 4096
    return TieringConfig.from_dict({"cpu_bytes_to_use": cpu_slots * stride, **extra})


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.002)


def freeze_process(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` and wait until every thread has stopped.

    ``kill`` returns once the signal is sent, not once it is obeyed: meanwhile a busy thread may
    still answer a request, which a test of a frozen peer must not see.
    """
    os.kill(pid, signal.SIGSTOP)
    tasks = Path(f"/proc/{pid}/task")
    wait_for(lambda: all(_stopped(task) for task in tasks.iterdir()), timeout)


def _stopped(task: Path) -> bool:
    try:
        state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True  # the thread is gone
    return state in ("T", "t")


def settle_lookup(tier: SecondaryTier, key: ChunkKey, timeout: float = 10.0) -> Lookup:
    """Ask ``tier`` until it answers something other than RETRY."""
    deadline = time.monotonic() + timeout
    while (answer := tier.lookup(key)) is RETRY:
        if time.monotonic() > deadline:
            raise AssertionError("lookup kept answering RETRY")
        time.sleep(0.002)
    return answer


def collect(
    tier: SecondaryTier, job_ids: Iterable[int], timeout: float = 20.0
) -> dict[int, JobResult]:
    """Poll ``tier`` until every job in ``job_ids`` has reported; fails on a duplicate result."""
    wanted, results = set(job_ids), {}
    deadline = time.monotonic() + timeout
    while wanted - results.keys():
        for result in tier.get_finished_jobs():
            assert result.job_id not in results, "a job result was handed out twice"
            results[result.job_id] = result
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs {sorted(wanted - results.keys())} never finished")
        time.sleep(0.002)
    return results
