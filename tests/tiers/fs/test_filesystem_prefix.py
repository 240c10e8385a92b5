"""Issue 26, finding 3: a bound smaller than one prompt kept the prompt's tail, which no lookup
can reach, and deleted its head. Now the head is kept, before and after a restart, and chunks
whose predecessor is gone are counted and go first."""

from __future__ import annotations

import os
from pathlib import Path

from kvtier import CacheIdentity, TieringManager
from kvtier.tiers.shared.codec import HEADER_BYTES
from tests.conftest import SMALL_LAYOUT, config, make_keys, settle, store

FILE = HEADER_BYTES + SMALL_LAYOUT.chunk_bytes
IDENTITY = CacheIdentity(model="m", layout=SMALL_LAYOUT)


def tiers(root: Path, **options: object) -> list[dict[str, object]]:
    return [{"type": "fs", "root_dir": str(root), "name": "disk", "min_free_bytes": 0, **options}]


def disk(manager: TieringManager) -> dict[str, int]:
    stats: dict[str, int] = manager.stats()["tiers"]["disk"]
    return stats


def test_a_prompt_longer_than_max_bytes_keeps_its_head_for_the_next_request(tmp_path: Path) -> None:
    keys = make_keys(IDENTITY, 8)
    options = tiers(tmp_path, max_bytes=3 * FILE)
    with TieringManager(config(16, secondary_tiers=options), IDENTITY) as first:
        store(first, keys)
        assert first.wait_idle(timeout=20)
        assert disk(first)["store_skipped_bound"] == 5
    with TieringManager(config(16, secondary_tiers=options), IDENTITY) as second:
        assert settle(second, keys) == 3  # the prompt's first three chunks, served from disk


def test_a_restart_under_a_smaller_bound_trims_tails_not_heads(tmp_path: Path) -> None:
    keys = make_keys(IDENTITY, 6)
    with TieringManager(config(16, secondary_tiers=tiers(tmp_path)), IDENTITY) as first:
        store(first, keys)
        assert first.wait_idle(timeout=20)
    for age, key in enumerate(keys):  # the head's file is the oldest, as a plain LRU sees it
        path = tmp_path / IDENTITY.hexdigest / key.hex()[:2] / key.hex()[2:4] / key.hex()
        os.utime(path, (1e9 + age, 1e9 + age))
    options = tiers(tmp_path, max_bytes=2 * FILE)
    with TieringManager(config(16, secondary_tiers=options), IDENTITY) as second:
        second.tiers[0].wait_scanned(20)  # type: ignore[attr-defined]
        assert settle(second, keys) == 2


def test_chunks_whose_predecessor_is_gone_are_counted_and_evicted_first(tmp_path: Path) -> None:
    keys, other = make_keys(IDENTITY, 4), make_keys(IDENTITY, 1, seed=9)
    with TieringManager(config(16, secondary_tiers=tiers(tmp_path)), IDENTITY) as first:
        store(first, other)  # the oldest chunk of all, reachable
        store(first, keys)
        assert first.wait_idle(timeout=20)
    head = keys[0].hex()
    (tmp_path / IDENTITY.hexdigest / head[:2] / head[2:4] / head).unlink()
    options = tiers(tmp_path, max_bytes=5 * FILE)
    with TieringManager(config(16, secondary_tiers=options), IDENTITY) as second:
        second.tiers[0].wait_scanned(20)  # type: ignore[attr-defined]
        assert disk(second)["unreachable_chunks"] == 3
        store(second, make_keys(IDENTITY, 4, seed=7))  # room for 1: then the orphans go
        assert second.wait_idle(timeout=20)
        assert disk(second)["unreachable_chunks"] == 0
        assert settle(second, other) == 1
