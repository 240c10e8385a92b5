"""A load job's chunk files read in one compiled call (``native.load_many``), on real files.

The call must give each chunk exactly what one ``load`` would (its bytes, its checksum, the
errno of what failed), and the tier must count each chunk of a mixed job as it counts it alone:
a good chunk loaded, a damaged one deleted, an absent one missing, a FIFO not regular.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path
from typing import Any

import pytest

from kvtier import CacheIdentity, ChunkKey
from kvtier.config import FsTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs import native
from kvtier.tiers.fs.pin import NamespacePin
from kvtier.tiers.fs.tier import FilesystemTier
from kvtier.tiers.shared import codec
from tests.conftest import collect, fill, holds, make_keys
from tests.tiers.fs.test_filesystem_integrity import chunk_path

needs_native = pytest.mark.skipif(not native.AVAILABLE, reason="_fastio is not built here")
O_DIRECT = getattr(os, "O_DIRECT", 0)
BODY = 8192


def _write(root: Path, name: str, data: bytes) -> str:
    level = root / name[:2] / name[2:4]
    level.mkdir(parents=True, exist_ok=True)
    (level / name).write_bytes(data)
    return f"{name[:2]}/{name[2:4]}/{name}"


def _load_many(root: Path, paths: list[str]) -> tuple[list[object] | None, memoryview, memoryview]:
    n = len(paths)
    headers, slots = memoryview(mmap.mmap(-1, n * 4096)), memoryview(mmap.mmap(-1, n * BODY))
    plains = [slots[i * BODY : (i + 1) * BODY] for i in range(n)]
    pin = NamespacePin.open(str(root))
    try:
        got = native.load_many(
            pin, paths, headers, plains, plains, os.O_RDONLY, False, O_DIRECT, True
        )
    finally:
        pin.close()
    return (None if got is None else list(got)), headers, slots


@needs_native
def test_each_file_gets_what_one_load_would_give(tmp_path: Path):
    bodies = [os.urandom(BODY), os.urandom(BODY)]
    good = [
        _write(tmp_path, f"{i:02x}cd" + "0" * 60, b"%d" % i * 4096 + b)
        for i, b in enumerate(bodies)
    ]
    short = _write(tmp_path, "eeee" + "0" * 60, b"s" * 4096 + bodies[0][:100])
    os.mkfifo(tmp_path / "ff")  # opening it for reading would wait for a writer, forever
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "cd").symlink_to(tmp_path / "00")  # a linked level: never followed
    paths = [good[0], "12/34/" + "1234" + "0" * 60, short, "ff", "ab/cd/" + "abcd" + "0" * 60]
    paths.append(good[1])
    results, headers, slots = _load_many(tmp_path, paths)
    assert results is not None and len(results) == len(paths)
    for index, body in ((0, bodies[0]), (5, bodies[1])):
        loaded = results[index]
        assert isinstance(loaded, tuple) and loaded[:2] == (4096 + BODY, 4096 + BODY)
        assert loaded[5] == codec.checksum(body)
        assert bytes(slots[index * BODY : (index + 1) * BODY]) == body
        assert bytes(headers[index * 4096 : (index + 1) * 4096]) == b"%d" % (index // 5) * 4096
    assert results[1] == errno.ENOENT
    short_read = results[2]
    assert isinstance(short_read, tuple) and short_read[1] == 4096 + 100
    assert short_read[5] == codec.checksum(bodies[0][:100])  # what was read, as load hashes it
    assert results[3] is None  # not a regular file: nothing read
    assert results[4] == errno.ELOOP  # the link refused, not followed


@needs_native
def test_a_swapped_namespace_hands_the_whole_job_back(tmp_path: Path):
    root = tmp_path / "ns"
    path = _write(root, "abcd" + "0" * 60, b"h" * 4096 + os.urandom(BODY))
    pin = NamespacePin.open(str(root))
    try:
        root.rename(tmp_path / "moved")
        root.mkdir()
        headers, slot = memoryview(mmap.mmap(-1, 8192)), memoryview(mmap.mmap(-1, 2 * BODY))
        plains = [slot[:BODY], slot[BODY:]]
        args = (os.O_RDONLY, False, O_DIRECT, True)
        assert native.load_many(pin, [path, path], headers, plains, plains, *args) is None
    finally:
        pin.close()


def stored_tier(
    root: Path, identity: CacheIdentity, n: int, spare: int = 0, **config: Any
) -> tuple[FilesystemTier, HostRegion, list[ChunkKey]]:
    """An fs tier under ``root`` (``config``: more of its fields) that stored ``n`` chunks from
    slots 0..n-1 of 64 KiB, with as many slots again to load them into, and ``spare`` more."""
    region = HostRegion(2 * n + spare, 64 << 10)
    tier = FilesystemTier(FsTierConfig(root_dir=str(root), **config), region, identity)
    tier.wait_scanned()
    keys = make_keys(identity, n)
    for slot, key in enumerate(keys):
        fill(region, slot, key)
    tier.submit_store(TransferJob(1, tuple(keys), tuple(range(n))))
    assert collect(tier, [1])[1].ok
    return tier, region, keys


@needs_native
def test_a_job_is_one_compiled_call(tmp_path: Path, identity: CacheIdentity, monkeypatch):
    tier, region, keys = stored_tier(tmp_path, identity, 4)
    calls: list[str] = []
    for name in ("load", "load_many"):
        original = getattr(native, name)
        monkeypatch.setattr(
            native, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a)
        )
    tier.submit_load(TransferJob(2, tuple(keys), (4, 5, 6, 7)))
    assert collect(tier, [2])[2].ok
    assert calls == ["load_many"]
    assert all(holds(region, 4 + i, key) for i, key in enumerate(keys))
    tier.close()


@pytest.mark.usefixtures("fs_io")
def test_each_chunk_of_a_mixed_job_is_counted_as_it_would_be_alone(
    tmp_path: Path, identity: CacheIdentity
):
    tier, region, keys = stored_tier(tmp_path, identity, 5)
    damaged = chunk_path(tmp_path, identity, keys[1])
    data = bytearray(damaged.read_bytes())
    data[codec.HEADER_BYTES + 7] ^= 1
    damaged.write_bytes(bytes(data))
    chunk_path(tmp_path, identity, keys[2]).unlink()
    fifo = chunk_path(tmp_path, identity, keys[3])
    fifo.unlink()
    os.mkfifo(fifo)
    tier.submit_load(TransferJob(2, tuple(keys), tuple(range(5, 10))))
    result = collect(tier, [2])[2]
    assert result.succeeded == {keys[0], keys[4]}
    assert result.integrity_failed == {keys[1]}
    stats = tier.stats()
    assert stats["loaded_chunks"] == 2
    assert stats["integrity.checksum"] == 1 and not damaged.exists()
    assert stats["load_missing"] == 1
    assert stats["load_failed.not_regular"] == 1 and fifo.exists()  # left alone
    assert holds(region, 5, keys[0]) and holds(region, 9, keys[4])
    tier.close()
