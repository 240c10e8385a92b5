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

from kvtier import CacheIdentity, ChunkKey
from kvtier.config import FsTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs import files as fs_files
from kvtier.tiers.fs import native
from kvtier.tiers.fs.tier import FilesystemTier
from tests.conftest import collect, fill, holds, make_keys

needs_native = pytest.mark.skipif(not native.AVAILABLE, reason="_fastio is not built here")
O_DIRECT = getattr(os, "O_DIRECT", 0)


def aligned(nbytes: int) -> memoryview:
    return memoryview(mmap.mmap(-1, nbytes))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="built on Linux only")
def test_the_compiled_io_is_built_on_linux():
    """`make test` installs with a compiler: a silent fallback would hide the slow path."""
    assert native.AVAILABLE and native.usable()


@needs_native
def test_store_writes_renames_and_truncates(tmp_path: Path):
    header, payload = b"h" * 4096, aligned(8192)
    payload[:] = b"p" * 8192
    assert native.store(str(tmp_path), "x.tmp", "x", (header, payload), 4096 + 5000, 0, False)
    assert (tmp_path / "x").read_bytes() == b"h" * 4096 + b"p" * 5000
    assert not (tmp_path / "x.tmp").exists()
    header_block = aligned(4096)  # O_DIRECT writes from page-aligned memory
    header_block[:] = header
    assert native.store(str(tmp_path), "y.tmp", "y", (header_block, payload), -1, O_DIRECT, True)
    assert (tmp_path / "y").stat().st_size == 4096 + 8192


@needs_native
def test_store_hands_back_what_it_cannot_do(tmp_path: Path):
    header, payload = b"h" * 4096, aligned(4096)
    missing = tmp_path / "ab" / "cd"
    assert not native.store(str(missing), "x.tmp", "x", (header, payload), -1, 0, False)
    assert not missing.exists()  # directories are the os-module walk's to create
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert not native.store(str(tmp_path / "link"), "x.tmp", "x", (header, payload), -1, 0, False)
    assert list((tmp_path / "real").iterdir()) == []  # never written through a link
    (tmp_path / "x").mkdir()  # a directory where the chunk belongs: rename fails, tmp removed
    assert not native.store(str(tmp_path), "x.tmp", "x", (header, payload), -1, 0, False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real", "x"]


def _load(path: Path, flags: int = os.O_RDONLY, adaptive: bool = False) -> native.Loaded | None:
    header, payload = aligned(4096), aligned(8192)
    return native.load(str(path), header, payload[:5000], payload, flags, adaptive, O_DIRECT)


@needs_native
def test_load_reads_regular_files_and_refuses_the_rest(tmp_path: Path):
    chunk = tmp_path / "chunk"
    chunk.write_bytes(b"h" * 4096 + b"p" * 5000)
    loaded = _load(chunk)
    found = chunk.stat()
    assert loaded == (4096 + 5000, 4096 + 5000, found.st_dev, found.st_ino, False)
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
    """Once a chunk's directories exist, stores and loads never take the os-module path."""
    region = HostRegion(4, 64 << 10)
    tier = FilesystemTier(FsTierConfig(root_dir=str(tmp_path)), region, identity)
    tier.wait_scanned()
    first, second = make_keys(identity, 2)
    second = ChunkKey(first[:4] + second[4:])  # the same level directories as the first
    fill(region, 0, first)
    tier.submit_store(TransferJob(1, (first,), (0,)))
    assert collect(tier, [1])[1].ok
    walked: list[str] = []
    for name in ("_write_walk", "_read_walk"):
        original = getattr(tier._files, name)
        monkeypatch.setattr(tier._files, name, _recording(walked, name, original))
    fill(region, 1, second)
    tier.submit_store(TransferJob(2, (second,), (1,)))
    assert collect(tier, [2])[2].ok
    tier.submit_load(TransferJob(3, (first, second), (2, 3)))
    assert collect(tier, [3])[3].ok
    assert holds(region, 2, first) and holds(region, 3, second)
    assert walked == []
    assert tier.stats()["native_io"] == 1
    tier.close()


def _recording(calls: list[str], name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def recorded(*args: Any) -> Any:
        calls.append(name)
        return method(*args)

    return recorded
