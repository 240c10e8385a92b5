"""``root_dir_max_bytes``: servers of different models sharing one directory hold at most the
bound together; nothing but chunk files is deleted; both sides of the number."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest

from kvtier import CacheIdentity, TieringManager
from kvtier.errors import ConfigError
from kvtier.tiers.shared.codec import HEADER_BYTES
from tests.conftest import SMALL_LAYOUT, config, make_keys, read, settle, store

FILE = HEADER_BYTES + SMALL_LAYOUT.chunk_bytes
WRITER = Path(__file__).with_name("shared_bound_writer.py")
ROOT_OF_REPO = Path(__file__).parents[3]


def chunk_bytes_under(root: Path) -> int:
    """Bytes of chunk files (64-hex names) under ``root``, every identity."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            if len(name) == 64:
                with suppress(FileNotFoundError):  # deleted while walking
                    total += (Path(directory) / name).stat().st_size
    return total


def fs_tier(root: Path, **options: object) -> list[dict[str, object]]:
    return [{"type": "fs", "root_dir": str(root), "name": "disk", "min_free_bytes": 0, **options}]


def test_three_servers_of_different_models_hold_at_most_the_bound_together(tmp_path: Path) -> None:
    root, bound = tmp_path / "shared", 24 * FILE
    root.mkdir()
    foreign = [root / "notes.txt", root / ("ab" * 32)]
    foreign[0].write_text("an operator's file")
    foreign[1].mkdir()
    (foreign[1] / "README").write_text("not a namespace of kvtier's layout")
    env = {**os.environ, "PYTHONPATH": str(ROOT_OF_REPO)}
    writers = [
        subprocess.Popen(
            [sys.executable, str(WRITER), str(root), f"model-{i}", str(bound), "6", "8"],
            stdout=subprocess.PIPE,
            env=env,
            cwd=ROOT_OF_REPO,
        )
        for i in range(3)
    ]
    peak, last = 0, 0
    while any(w.poll() is None for w in writers):
        # A walk is not a snapshot: a file counted early in it can be evicted and its
        # replacement counted later in the same walk (seen: one walk at 32 files, the next two
        # at 24). So a size counts when two walks in a row see it.
        now = chunk_bytes_under(root)
        peak, last = max(peak, min(now, last)), now
        time.sleep(0.01)
    outputs = [w.communicate(timeout=120)[0] for w in writers]
    assert all(w.returncode == 0 for w in writers)
    stats = [json.loads(out) for out in outputs]
    written = sum(s.get("stored_chunks", 0) for s in stats)
    assert written * FILE > 2 * bound  # together they wrote far more than the bound
    in_flight = 3 * 2 * FILE  # one chunk per writer thread, 2 threads per server
    assert peak <= bound + in_flight
    assert chunk_bytes_under(root) <= bound + in_flight
    assert sum(s.get("evicted_shared", 0) for s in stats) > 0
    assert foreign[0].read_text() == "an operator's file"
    assert (foreign[1] / "README").exists()


def test_a_server_keeps_its_heads_and_loses_tails_to_another_models_writes(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    a = CacheIdentity(model="a", layout=SMALL_LAYOUT)
    b = CacheIdentity(model="b", layout=SMALL_LAYOUT)
    tiers = fs_tier(root, root_dir_max_bytes=6 * FILE)
    with TieringManager(config(16, secondary_tiers=tiers), a) as first:
        keys_a = make_keys(a, 4)
        store(first, keys_a)
        assert first.wait_idle(timeout=20)
    time.sleep(0.02)  # b's chunks are newer by mtime
    with TieringManager(config(16, secondary_tiers=tiers), b) as second:
        store(second, make_keys(b, 4))
        assert second.wait_idle(timeout=20)
    assert chunk_bytes_under(root) <= 6 * FILE
    with TieringManager(config(16, secondary_tiers=tiers), a) as again:
        again.tiers[0].wait_scanned(20)  # type: ignore[attr-defined]
        assert settle(again, keys_a) == 2  # a's tail went first, its head is served


@pytest.mark.parametrize("bound", [FILE - 1, 0])
def test_a_bound_below_one_chunk_file_is_refused_naming_the_key(tmp_path: Path, bound: int) -> None:
    identity = CacheIdentity(model="m", layout=SMALL_LAYOUT)
    tiers = fs_tier(tmp_path, root_dir_max_bytes=bound)
    with pytest.raises(ConfigError, match="root_dir_max_bytes"):
        TieringManager(config(4, secondary_tiers=tiers), identity).close()


def test_a_bound_of_exactly_one_chunk_file_holds_one(tmp_path: Path) -> None:
    identity = CacheIdentity(model="m", layout=SMALL_LAYOUT)
    tiers = fs_tier(tmp_path, root_dir_max_bytes=FILE)
    with TieringManager(config(8, secondary_tiers=tiers), identity) as manager:
        store(manager, make_keys(identity, 3, seed=1)[:1])
        store(manager, make_keys(identity, 3, seed=2)[:1])
        assert manager.wait_idle(timeout=20)
    assert chunk_bytes_under(tmp_path) == FILE


def test_a_ledger_that_is_not_a_regular_file_fails_the_start(tmp_path: Path) -> None:
    (tmp_path / ".kvtier-usage").mkdir()
    identity = CacheIdentity(model="m", layout=SMALL_LAYOUT)
    tiers = fs_tier(tmp_path, root_dir_max_bytes=4 * FILE)
    with pytest.raises(Exception, match="ledger"):
        TieringManager(config(4, secondary_tiers=tiers), identity).close()


def test_a_write_renamed_into_place_but_not_yet_reported_is_counted_once(tmp_path: Path) -> None:
    """The race CI found: a listing between a write's rename and its ``wrote`` counted that
    chunk on disk and in flight, so the next write deleted it and was still refused."""
    from kvtier.keys import ChunkKey
    from kvtier.tiers.fs.shared_bound import SharedBound

    namespace = "ab" * 32
    bound = SharedBound(str(tmp_path), FILE, namespace, 0o600)
    try:
        first, second = ChunkKey(bytes(32)), ChunkKey(bytes([1]) * 32)
        assert bound.reserve(FILE, first) == []
        name = first.hex()
        level = tmp_path / namespace / name[:2] / name[2:4]
        level.mkdir(parents=True)
        (level / name).write_bytes(b"x" * FILE)  # renamed into place; wrote() not called yet
        assert bound.reserve(FILE, second) == [first]
        assert bound.total() == FILE
    finally:
        bound.close()


def test_an_instance_forgets_chunks_another_deleted_keeping_at_most_what_the_bound_holds(
    tmp_path: Path,
) -> None:
    """Two servers of one model share a namespace: each deletes the other's files to stay
    under the bound, and the one whose files went keeps no more entries than the directory can
    hold (they were kept for ever: 122 entries for 20 files after a long run)."""
    identity = CacheIdentity(model="m", layout=SMALL_LAYOUT)
    tiers = fs_tier(tmp_path, root_dir_max_bytes=4 * FILE)
    with (
        TieringManager(config(32, secondary_tiers=tiers), identity) as a,
        TieringManager(config(32, secondary_tiers=tiers), identity) as b,
    ):
        for seed in range(4):
            store(a, make_keys(identity, 1, seed=seed))
        assert a.wait_idle(timeout=20)
        for seed in range(10, 18):
            store(b, make_keys(identity, 1, seed=seed))  # deletes a's four files
        assert b.wait_idle(timeout=20)
        for seed in range(20, 24):
            store(a, make_keys(identity, 1, seed=seed))
        assert a.wait_idle(timeout=20)
        stats = a.tiers[0].stats()  # type: ignore[attr-defined]
    assert chunk_bytes_under(tmp_path) <= 4 * FILE
    assert stats["index_chunks"] == 4 and stats["index_forgotten"] == 4


def test_without_a_bound_the_index_remembers_max_index_chunks_and_probes_find_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    identity = CacheIdentity(model="m", layout=SMALL_LAYOUT)
    tiers = fs_tier(tmp_path)
    keys = make_keys(identity, 5)
    with TieringManager(config(8, secondary_tiers=tiers), identity) as first:
        store(first, keys)
        assert first.wait_idle(timeout=20)
    monkeypatch.setattr("kvtier.tiers.fs.index.MAX_INDEX_CHUNKS", 3)
    with TieringManager(config(8, secondary_tiers=tiers), identity) as again:
        tier = again.tiers[0]
        assert tier.wait_scanned(20)  # type: ignore[attr-defined]
        stats = tier.stats()  # type: ignore[attr-defined]
        assert stats["index_chunks"] == 3 and stats["index_forgotten"] == 2
        assert settle(again, keys) == 5  # the two forgotten are probed and found
        assert read(again, keys)
        assert tier.stats()["probe_hits"] == 2  # type: ignore[attr-defined]
