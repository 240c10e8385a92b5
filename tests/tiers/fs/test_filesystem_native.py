"""The compiled chunk-file I/O (``kvtier.tiers.fs.native`` over ``_fastio``), on real files.

It must be what the fs tier uses where it is built, keep the ``os``-module path's rules (no
link followed, no blocking open, nothing but a regular file read), and hand every case it does
not handle back to that path. The tier's own tests run both ways (the ``fs_io`` fixture).
"""

from __future__ import annotations

import errno
import mmap
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvtier import CacheIdentity
from kvtier.config import FsTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs import files as fs_files
from kvtier.tiers.fs import io as fs_io
from kvtier.tiers.fs import native
from kvtier.tiers.fs.pin import NamespacePin
from kvtier.tiers.fs.tier import FilesystemTier
from kvtier.tiers.shared import codec
from tests.conftest import collect, fill, holds, make_keys

needs_native = pytest.mark.skipif(not native.AVAILABLE, reason="_fastio is not built here")
O_DIRECT = getattr(os, "O_DIRECT", 0)


def aligned(nbytes: int) -> memoryview:
    return memoryview(mmap.mmap(-1, nbytes))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="built on Linux only")
def test_the_compiled_io_is_built_on_linux():
    """`make test` installs with a compiler: a silent fallback would hide the slow path."""
    assert native.AVAILABLE and native.usable()


NAME = "abcd" + "0" * 60


def pinned(path: Path) -> NamespacePin:
    return NamespacePin.open(str(path))


@needs_native
def test_store_writes_renames_and_truncates(tmp_path: Path):
    header, payload = b"h" * 4096, aligned(8192)
    payload[:] = b"p" * 8192
    pin = pinned(tmp_path)
    assert native.store(pin, NAME, "x.tmp", (header, payload), 4096 + 5000, 0, False)
    level = tmp_path / "ab" / "cd"  # made where missing
    assert sorted(p.name for p in level.iterdir()) == [NAME]
    assert (level / NAME).read_bytes() == b"h" * 4096 + b"p" * 5000
    header_block = aligned(4096)  # O_DIRECT writes from page-aligned memory
    header_block[:] = header
    other = "abce" + "0" * 60
    assert native.store(pin, other, "y.tmp", (header_block, payload), -1, O_DIRECT, True)
    assert (tmp_path / "ab" / "ce" / other).stat().st_size == 4096 + 8192


@needs_native
def test_store_hands_back_what_it_cannot_do(tmp_path: Path):
    header, payload = b"h" * 4096, aligned(4096)
    outside = tmp_path / "outside"
    outside.mkdir()
    namespace = tmp_path / "ns"
    namespace.mkdir()
    pin = pinned(namespace)
    (namespace / "ab").symlink_to(outside)  # a linked level: never followed, not even to mkdir
    assert not native.store(pin, NAME, "x.tmp", (header, payload), -1, 0, False)
    (namespace / "12").write_bytes(b"")  # a file where a level directory belongs
    assert not native.store(pin, "12" + NAME[2:], "x.tmp", (header, payload), -1, 0, False)
    (namespace / "34" / "56" / ("3456" + NAME[4:])).mkdir(parents=True)  # a directory there
    assert not native.store(pin, "3456" + NAME[4:], "x.tmp", (header, payload), -1, 0, False)
    namespace.rename(tmp_path / "moved")
    namespace.symlink_to(outside)  # the namespace swapped: refused, never followed
    assert not native.store(pin, "7890" + NAME[4:], "x.tmp", (header, payload), -1, 0, False)
    assert list(outside.iterdir()) == []
    assert not [p for p in namespace.rglob("*.tmp")]  # no temporary file left behind


def _load(path: Path, flags: int = os.O_RDONLY, adaptive: bool = False) -> native.Loaded | None:
    header, payload = aligned(4096), aligned(8192)
    pin = pinned(path.parent)
    try:
        return native.load(
            pin, path.name, header, payload[:5000], payload, flags, adaptive, O_DIRECT, False
        )
    finally:
        pin.close()


@needs_native
def test_load_reads_regular_files_and_refuses_the_rest(tmp_path: Path):
    chunk = tmp_path / "chunk"
    chunk.write_bytes(b"h" * 4096 + b"p" * 5000)
    loaded = _load(chunk)
    found = chunk.stat()
    assert loaded == (4096 + 5000, 4096 + 5000, found.st_dev, found.st_ino, False, None)
    with pytest.raises(FileNotFoundError):
        _load(tmp_path / "absent")
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would wait for a writer, forever
    (tmp_path / "link").symlink_to(chunk)
    (tmp_path / "dir").mkdir()
    for odd in ("fifo", "link", "dir"):
        assert _load(tmp_path / odd) is None, odd


@needs_native
def test_adaptive_loads_read_uncached_files_with_o_direct(tmp_path: Path):
    chunk = tmp_path / "chunk"
    chunk.write_bytes(os.urandom(4096 + 8192))
    with open(chunk, "rb") as file:
        file.read()
    if _direct_refused(chunk):
        pytest.skip("this filesystem refuses O_DIRECT")
    cached = _load(chunk, adaptive=True)
    assert cached is not None and cached[4] is False
    fd = os.open(chunk, os.O_RDONLY)
    os.fsync(fd)  # dirty pages stay cached whatever the advice
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    cold = _load(chunk, adaptive=True)
    assert cold is not None and cold[1] == 4096 + 8192
    assert cold[4] is fs_files.CACHESTAT.available  # without cachestat: O_DIRECT, as documented


def _direct_refused(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_RDONLY | O_DIRECT))
    except OSError as exc:
        return exc.errno == errno.EINVAL
    return False


@needs_native
def test_the_tier_takes_the_compiled_path(tmp_path, identity: CacheIdentity, monkeypatch):
    """Stores (their directories made on the way) and loads never take the os-module path."""
    region = HostRegion(4, 64 << 10)
    tier = FilesystemTier(FsTierConfig(root_dir=str(tmp_path)), region, identity)
    tier.wait_scanned()
    keys = make_keys(identity, 2)
    walked: list[str] = []
    for owner, name in ((tier._files, "_write_walk"), (tier._files.reader, "_read_walk")):
        original = getattr(owner, name)
        monkeypatch.setattr(owner, name, _recording(walked, name, original))
    for slot, key in enumerate(keys):
        fill(region, slot, key)
    tier.submit_store(TransferJob(1, tuple(keys), (0, 1)))
    assert collect(tier, [1])[1].ok
    tier.submit_load(TransferJob(2, tuple(keys), (2, 3)))
    assert collect(tier, [2])[2].ok
    assert holds(region, 2, keys[0]) and holds(region, 3, keys[1])
    assert walked == []
    assert tier.stats()["native_io"] == 1
    tier.close()


def _recording(calls: list[str], name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def recorded(*args: Any) -> Any:
        calls.append(name)
        return method(*args)

    return recorded


def test_the_os_path_resumes_short_writes_and_fails_on_no_progress(tmp_path: Path, monkeypatch):
    real = os.pwritev
    answers = iter([3, 0])  # a short write, then none at all

    def stingy(fd: int, buffers: Any, offset: int) -> int:
        wanted = next(answers, None)
        if wanted is None:
            return real(fd, buffers, offset)
        return real(fd, [memoryview(b"".join(bytes(b) for b in buffers))[:wanted]], offset)

    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        monkeypatch.setattr(fs_io.os, "pwritev", stingy)
        with pytest.raises(OSError) as failed:
            fs_io.pwrite_all(fd, [b"abcdef", b"ghij"])
        assert failed.value.errno == errno.EIO
        fs_io.pwrite_all(fd, [b"abcdef", b"ghij"])  # every byte, however it comes
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"abcdefghij"


LENGTH_EDGE = 256 * 1024  # lengths around a power of two: block and stripe edges of the hash


@needs_native
@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize(
    "length", [100, 4096, LENGTH_EDGE - 1, LENGTH_EDGE, LENGTH_EDGE + 1, 3 * LENGTH_EDGE + 4096]
)
def test_a_folded_load_returns_the_checksum_of_what_it_read(
    tmp_path: Path, length: int, direct: bool
):
    """Across every piece boundary, with the page cache and with O_DIRECT, the checksum folded
    during the read is the checksum of the payload bytes read (the slot's first ``length``)."""
    body = os.urandom(length)
    chunk = tmp_path / "chunk"
    chunk.write_bytes(b"h" * 4096 + body)
    if direct and _direct_refused(chunk):
        pytest.skip("this filesystem refuses O_DIRECT")
    stride = -(-length // 4096) * 4096
    header, slot = aligned(4096), aligned(stride + 4096)
    pin = pinned(tmp_path)
    try:
        flags = os.O_RDONLY | (O_DIRECT if direct else 0)
        loaded = native.load(
            pin, "chunk", header, slot[:length], slot[:stride], flags, False, O_DIRECT, True
        )
    finally:
        pin.close()
    assert loaded is not None
    assert loaded[1] == 4096 + length and loaded[4] is direct
    assert bytes(slot[:length]) == body
    assert loaded[5] == codec.checksum(body)


@needs_native
def test_a_folded_load_of_a_short_file_hashes_what_it_got(tmp_path: Path):
    body = os.urandom(LENGTH_EDGE + 10)
    chunk = tmp_path / "chunk"
    chunk.write_bytes(b"h" * 4096 + body)  # a chunk of 2 * LENGTH_EDGE expected: short
    header, slot = aligned(4096), aligned(2 * LENGTH_EDGE)
    pin = pinned(tmp_path)
    try:
        loaded = native.load(pin, "chunk", header, slot, slot, os.O_RDONLY, False, O_DIRECT, True)
    finally:
        pin.close()
    assert loaded is not None and loaded[1] == 4096 + len(body)
    assert loaded[5] == codec.checksum(body)


@needs_native
@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("length", [100, LENGTH_EDGE, LENGTH_EDGE + 1, 3 * LENGTH_EDGE + 4096])
def test_a_folded_store_fills_in_both_checksums(tmp_path: Path, length: int, direct: bool):
    """The header written is the one ``codec.encode_header`` makes for the payload: payload
    checksum and header checksum filled in by the call, across every piece boundary."""
    body = os.urandom(length)
    stride = -(-length // 4096) * 4096
    slot = aligned(stride)
    slot[:length] = body
    identity, key = b"i" * 32, b"k" * 32
    header = aligned(4096)
    header[:] = codec.encode_header(identity, key, body, bytes(16))  # checksums still wrong
    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    if direct and _direct_refused(probe):
        pytest.skip("this filesystem refuses O_DIRECT")
    flags, truncate = (O_DIRECT, 4096 + length) if direct else (0, -1)
    payload = slot if direct else slot[:length]
    pin = pinned(tmp_path)
    stored = native.store(
        pin, NAME, "t.tmp", (header, payload), truncate, flags, False, fold_at=codec.CHECKSUM_AT
    )
    assert stored
    pin.close()
    written = (tmp_path / "ab" / "cd" / NAME).read_bytes()
    assert written == codec.encode_header(identity, key, body) + body
    codec.verify(written[:4096], written[4096:], identity, key)


@needs_native
def test_a_folded_store_needs_a_writable_header_with_room(tmp_path: Path):
    pin = pinned(tmp_path)
    payload = aligned(4096)
    for header, at in (
        (b"h" * 4096, codec.CHECKSUM_AT),
        (aligned(4096), 4090),
        (aligned(4096), -1),
    ):
        with pytest.raises(ValueError, match="cannot fill in a checksum"):
            native.store(pin, NAME, "t.tmp", (header, payload), -1, 0, False, fold_at=at)
    pin.close()
    assert not list(tmp_path.iterdir())  # nothing written
