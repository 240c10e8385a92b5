"""The compiled listing (``_fastio.scan_chunks``) and the ``os``-module one give the same rows
and count the same odd entries, on a tree planted with everything that is not a chunk."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kvtier.cache import fs_records
from kvtier.cache.records import Problems
from kvtier.tiers.fs import native
from tests.cache.cache_tree import FsCache, chain, make_identity

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="_fastio is not built")


def planted(tmp_path: Path) -> tuple[Path, list[bytes], bytes]:
    """A namespace whose ``ab`` holds a chain of chunks and every odd entry."""
    cache, identity = FsCache(tmp_path), make_identity("m")
    keys = [k for k in chain(identity, 400) if k[0] == 0xAB][:6]
    keys = [bytes([0xAB, 0xCD]) + k[2:] for k in keys[:3]] + keys[3:]
    cache.write_chain(identity, keys)
    level = tmp_path / identity.hexdigest / "ab" / "cd"
    odd = bytes([0xAB, 0xCD]) + bytes(30)
    os.mkfifo(level / odd.hex())  # a FIFO where a chunk belongs: never opened
    (level / (bytes([0xAB, 0xCD, 1]) + bytes(29)).hex()).symlink_to("/etc/passwd")
    (level / (bytes([0xAB, 0xCD, 2]) + bytes(29)).hex()).mkdir()
    misplaced = bytes([0xAB, 0x01]) + bytes(30)
    (level / misplaced.hex()).write_bytes(b"x")  # a key name under the wrong cd
    (level / f"{keys[0].hex()}.host-1-ab-0.tmp").write_bytes(b"")
    (level / "notes.txt").write_text("an operator's")
    (tmp_path / identity.hexdigest / "ab" / "ee").symlink_to(level)  # a level that is a link
    (tmp_path / identity.hexdigest / "ab" / "zz").mkdir()
    return tmp_path / identity.hexdigest, keys, misplaced


def listed(
    ns: Path, monkeypatch: pytest.MonkeyPatch, compiled: bool
) -> tuple[dict, Problems, list[str]]:
    if not compiled:
        monkeypatch.setattr(native, "scan_chunks", lambda *args, **kw: None)
    problems, temporaries = Problems(), []
    fd = os.open(ns, os.O_RDONLY | os.O_DIRECTORY)
    try:
        where = f"{ns}/ab"
        rows = fs_records.tree_records(
            fd, "ab", where, problems, links=True, temporaries=temporaries
        )
    finally:
        os.close(fd)
        monkeypatch.undo()
    parents = fs_records.parents_of(rows)
    found = {
        bytes(r["key"]): (int(r["size"]), float(r["mtime"]), p)
        for r, p in zip(rows, parents, strict=True)
    }
    return found, problems, temporaries


def test_the_compiled_listing_and_the_os_listing_agree_on_a_hostile_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns, keys, misplaced = planted(tmp_path)
    fast, fast_problems, fast_temporaries = listed(ns, monkeypatch, compiled=True)
    slow, slow_problems, slow_temporaries = listed(ns, monkeypatch, compiled=False)
    assert fast == slow
    assert fast_temporaries == slow_temporaries == [f"{keys[0].hex()}.host-1-ab-0.tmp"]
    assert set(fast) == set(keys[:3]) | set(keys[3:])
    assert [fast[k][2] for k in keys] == [None, *keys[:-1]]  # every link read back
    assert fast_problems.counts == slow_problems.counts
    assert fast_problems.counts["not_regular"] == 4  # FIFO, symlink, dir, level link
    assert fast_problems.counts["in_progress"] == 1
    assert fast_problems.counts["foreign"] == 3  # misplaced key, notes.txt, level "zz"
    assert misplaced not in fast


def test_an_empty_level_gives_no_rows(tmp_path: Path) -> None:
    (tmp_path / "ab").mkdir()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        rows = fs_records.tree_records(fd, "ab", str(tmp_path / "ab"), Problems(), links=True)
    finally:
        os.close(fd)
    assert len(rows) == 0 and rows.dtype == native.CHUNK_RECORD
    assert np.asarray(rows["size"]).sum() == 0
