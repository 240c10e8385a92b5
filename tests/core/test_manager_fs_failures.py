"""The manager's failure scenarios on a real filesystem tier, not only on a fault-injecting fake.

A failed write (a full disk, a root directory that is gone), a failed load (a chunk file
damaged or deleted on disk), and a slow tier (the fs tier behind the fault wrapper's delay, or
a tier that is still copying while the fs tier has finished): the engine is always served
identical bytes or told to recompute, host slots stay held while a tier still reads them, and a
failure is not retried in a loop.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvtier import RETRY, TieringManager
from kvtier.telemetry.kv_events import EventKind
from tests.conftest import (
    config,
    make_keys,
    push_out,
    read,
    settle,
    store,
    wait_for,
)

PLUGIN = "tests.plugins.outside_tier"


def fs(root: Path, **options: object) -> dict[str, object]:
    return {"type": "fs", "root_dir": str(root), "name": "fs", "min_free_bytes": 0, **options}


def make(identity, slots, *tiers) -> TieringManager:
    return TieringManager(config(slots, secondary_tiers=list(tiers)), identity)


def chunks(m, tier, op, outcome="ok") -> float:
    return m.metrics.telemetry.get("kvtier_tier_chunks_total", tier=tier, op=op, outcome=outcome)


def recomputed(m) -> dict[str, float]:
    prefix = "kvtier_recomputed_chunks_total{reason="
    counters = m.stats()["counters"]
    return {k[len(prefix) : -1]: v for k, v in counters.items() if k.startswith(prefix)}


def promoted_from(m) -> dict[bytes, str]:
    return {e.key: e.source for e in m.take_events() if e.kind is EventKind.PROMOTED}


def chunk_file(root: Path, key: bytes) -> Path:
    (path,) = [p for p in root.rglob(key.hex()) if p.is_file()]
    return path


# -- a slow tier ------------------------------------------------------------------------------
@pytest.mark.parametrize("slow_index", [0, 1], ids=["slow-tier-first", "fs-first"])
def test_the_write_through_hold_lasts_until_the_slowest_tier_has_copied(
    identity, tmp_path, slow_index
):
    """The fs tier has written and reported; another tier is still copying the same slots: they
    stay held (not evictable) until that tier has reported too."""
    gated = {"module_path": PLUGIN, "type": "GatedTier", "name": "slow"}
    tiers = [fs(tmp_path)]
    tiers.insert(slow_index, gated)
    with make(identity, 2, *tiers) as m:
        slow = m.tiers[slow_index]
        keys = make_keys(identity, 2)
        store(m, keys)
        wait_for(lambda: (m.poll(), chunks(m, "fs", "store"))[1] == 2, what="the fs tier's write")
        assert slow.started.wait(10), "the slow tier never began its store"
        m.poll()
        assert m.stats()["host"]["held_slots"] == 2
        assert m.prepare_store(make_keys(identity, 1, seed=9)) is None, "a held slot was evicted"
        slow.gate.set()
        wait_for(lambda: (m.poll(), chunks(m, "slow", "store"))[1] == 2, what="the slow write")
        assert m.stats()["host"]["held_slots"] == 0
        assert m.prepare_store(make_keys(identity, 1, seed=9)) is not None


def test_a_slow_fs_write_keeps_its_slots_held_until_it_reports(identity, tmp_path):
    slow = {"type": "fault", "inner": fs(tmp_path), "delay_s": 0.3, "name": "slowfs"}
    with make(identity, 2, slow) as m:
        keys = make_keys(identity, 2)
        store(m, keys)
        assert m.prepare_store(make_keys(identity, 1, seed=9)) is None
        assert m.wait_idle(20)
        assert chunks(m, "slowfs", "store") == 2
        assert m.prepare_store(make_keys(identity, 1, seed=9)) is not None


def test_a_slow_fs_promotion_answers_retry_then_identical_bytes_once(identity, tmp_path):
    """Asked again while the promotion runs, the manager answers RETRY without a second load."""
    slow = {"type": "fault", "inner": fs(tmp_path), "delay_s": 0.05, "name": "slowfs"}
    with make(identity, 4, slow) as m:
        keys = make_keys(identity, 4)
        store(m, keys)
        push_out(m, identity, 4)
        assert m.lookup(keys) is RETRY
        assert m.lookup(keys[:1]) is RETRY
        assert settle(m, keys) == 4 and read(m, keys)
        assert m.tiers[0].calls["load"] == 1
        assert set(promoted_from(m).values()) == {"slowfs"}


# -- a failed write ---------------------------------------------------------------------------
def test_a_full_disk_fails_the_fs_writes_and_another_tier_serves(identity, tmp_path):
    """``min_free_bytes`` above what the disk holds: every fs store is refused (ENOSPC)."""
    full = fs(tmp_path / "fs", min_free_bytes=shutil.disk_usage(tmp_path).total + 1)
    with make(identity, 2, full, {"type": "memory", "name": "ram"}) as m:
        keys = make_keys(identity, 2)
        store(m, keys)
        assert m.wait_idle(20)
        assert chunks(m, "fs", "store", "failed") == 2 and chunks(m, "ram", "store") == 2
        assert any(k.startswith("store_failed") for k in m.stats()["tiers"]["fs"])
        push_out(m, identity, 2)
        assert settle(m, keys) == 2 and read(m, keys)
        assert set(promoted_from(m).values()) == {"ram"}


def test_while_the_root_dir_is_gone_chunks_are_recomputed_and_then_written_again(
    identity, tmp_path
):
    root, away = tmp_path / "fs", tmp_path / "away"
    with make(identity, 2, fs(root)) as m:
        root.rename(away)
        root.write_bytes(b"a file where the cache directory was")
        keys = make_keys(identity, 2)
        store(m, keys)
        assert m.wait_idle(20)
        assert chunks(m, "fs", "store", "failed") == 2
        push_out(m, identity, 2)
        assert settle(m, keys) == 0  # a recompute, not an exception

        root.unlink()
        away.rename(root)
        store(m, keys)
        assert m.wait_idle(20)
        assert chunks(m, "fs", "store") >= 2
        push_out(m, identity, 2, seed=2000)
        assert settle(m, keys) == 2 and read(m, keys)
        assert set(promoted_from(m)) >= set(keys)


# -- a failed load ----------------------------------------------------------------------------
def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "flipped":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "emptied":
        path.write_bytes(b"")
    else:
        path.unlink()


@pytest.mark.parametrize("how", ["flipped", "truncated", "emptied", "deleted"])
def test_a_damaged_chunk_file_costs_a_recompute_never_wrong_bytes(identity, tmp_path, how):
    """The third of four chunks is damaged on disk: the first two are served, identical; the
    rest is recomputed, and asking again does not load the damaged chunk again."""
    root = tmp_path / "fs"
    with make(identity, 4, fs(root)) as m:
        keys = make_keys(identity, 4)
        store(m, keys)
        push_out(m, identity, 4)
        damage(chunk_file(root, keys[2]), how)
        assert settle(m, keys) == 2 and read(m, keys[:2])
        failed = chunks(m, "fs", "load", "failed")
        assert failed == 1
        for _ in range(3):
            assert settle(m, keys) == 2
        assert chunks(m, "fs", "load", "failed") == failed, "the failed chunk was loaded again"
        reasons = recomputed(m)
        if how == "deleted":
            assert reasons.get("integrity_failure", 0) == 0
        else:
            assert reasons.get("integrity_failure", 0) >= 1
            assert not list(root.rglob(keys[2].hex())), "the damaged file was deleted"


def test_chunks_damaged_in_the_fs_tier_come_from_the_next_tier(identity, tmp_path):
    root = tmp_path / "fs"
    with make(identity, 4, fs(root), {"type": "memory", "name": "ram"}) as m:
        keys = make_keys(identity, 4)
        store(m, keys)
        push_out(m, identity, 4)
        damage(chunk_file(root, keys[2]), "flipped")
        damage(chunk_file(root, keys[3]), "truncated")
        assert settle(m, keys) == 4 and read(m, keys)
        sources = promoted_from(m)
        assert [sources[k] for k in keys] == ["fs", "fs", "ram", "ram"]
