"""The fs tier's page-cache policy ("auto") and its one-syscall opens (openat2).

"auto" writes through the page cache while memory is free and reads a chunk through the cache
only when all of it is cached (else O_DIRECT); every path verifies what it read. Where openat2
is missing, the tier walks the levels as before, with the same answers.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier import CacheIdentity, ChunkKey
from kvtier.config import FsTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs import files as fs_files
from kvtier.tiers.fs import paths as fs_paths
from kvtier.tiers.fs.page_cache import CACHESTAT, PageCacheBudget, read_meminfo
from kvtier.tiers.fs.tier import FilesystemTier
from kvtier.tiers.shared.codec import HEADER_BYTES
from tests.conftest import collect, fill, holds, make_keys
from tests.tiers.fs.chunk_files import chunk_file, drop_page_cache

#: Every test runs with the compiled chunk-file I/O and with the os-module path.
pytestmark = pytest.mark.usefixtures("fs_io")

SLOT_BYTES = 64 << 10


@pytest.fixture
def region() -> HostRegion:
    return HostRegion(8, SLOT_BYTES)


@pytest.fixture
def tier(tmp_path: Path, region: HostRegion, identity: CacheIdentity) -> Iterator[FilesystemTier]:
    made = FilesystemTier(FsTierConfig(root_dir=str(tmp_path / "cache")), region, identity)
    made.wait_scanned()
    yield made
    made.close()


def _store(tier: FilesystemTier, region: HostRegion, keys: list[ChunkKey]) -> None:
    for slot, key in enumerate(keys):
        fill(region, slot, key)
    tier.submit_store(TransferJob(1, tuple(keys), tuple(range(len(keys)))))
    assert collect(tier, [1])[1].ok


def _load(tier: FilesystemTier, keys: list[ChunkKey], job_id: int) -> bool:
    slots = tuple(range(4, 4 + len(keys)))
    tier.submit_load(TransferJob(job_id, tuple(keys), slots))
    return collect(tier, [job_id])[job_id].ok


def _adaptive(tier: FilesystemTier) -> FilesystemTier:
    if not tier._files.adaptive:
        pytest.skip("no O_DIRECT or no cachestat here: 'auto' is plain O_DIRECT")
    return tier


def test_auto_loads_cached_and_cold_chunks_verified(tier, region, identity):
    tier = _adaptive(tier)
    keys = make_keys(identity, 2)
    _store(tier, region, keys)
    assert _load(tier, keys, 2)  # just written: through the page cache
    drop_page_cache(chunk_file(tier, keys[0]))
    assert _load(tier, keys, 3)  # one cold (O_DIRECT), one cached
    assert all(holds(region, 4 + i, key) for i, key in enumerate(keys))
    assert tier.stats()["loaded_chunks"] == 4


@pytest.mark.parametrize("cold", [False, True])
def test_auto_detects_damage_on_eitherchunk_file(tier, region, identity, cold):
    tier = _adaptive(tier)
    keys = make_keys(identity, 1)
    _store(tier, region, keys)
    path = chunk_file(tier, keys[0])
    with open(path, "r+b") as file:
        file.seek(HEADER_BYTES + SLOT_BYTES // 2)
        file.write(b"\xff" * 16)
    if cold:
        drop_page_cache(path)
    assert not _load(tier, keys, 2)
    assert tier.stats()["integrity.checksum"] == 1
    assert not path.exists()


def test_cachestat_counts_cached_pages(tmp_path):
    if not CACHESTAT.available:
        pytest.skip("no cachestat on this kernel")
    path = tmp_path / "f"
    path.write_bytes(b"x" * (64 << 10))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert CACHESTAT.is_cached(fd, 64 << 10)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert not CACHESTAT.is_cached(fd, 64 << 10)
    finally:
        os.close(fd)


def test_writes_use_the_cache_only_while_memory_is_free(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:        1000 kB\nMemFree:          450 kB\nCached: 7 kB\n")
    assert read_meminfo(str(meminfo)) == (1000 * 1024, 450 * 1024)
    policy = PageCacheBudget(reserve_fraction=0.25, interval_s=3600, meminfo=str(meminfo))
    assert policy.write_buffered(100 * 1024)  # 450 - 250 kB reserve = 200 kB of room
    assert policy.write_buffered(100 * 1024)
    assert not policy.write_buffered(1)  # room spent until the next look at meminfo
    unreadable = PageCacheBudget(meminfo=str(tmp_path / "missing"))
    assert not unreadable.write_buffered(1)  # unknown: O_DIRECT, the safe side


def test_without_openat2_the_walk_gives_the_same_answers(tier, region, identity, monkeypatch):
    monkeypatch.setattr(fs_paths.OPENAT2, "available", False)
    keys = make_keys(identity, 3)
    _store(tier, region, keys)
    assert _load(tier, keys, 2)
    assert fs_files.ChunkFiles.size_of(tier._files, keys[0]) == HEADER_BYTES + SLOT_BYTES
    level = chunk_file(tier, keys[1]).parent
    target = level.with_name(level.name + "-real")
    level.rename(target)
    level.symlink_to(target)  # a linked level is never followed, on either path
    assert not _load(tier, keys[1:2], 3)
    monkeypatch.setattr(fs_paths.OPENAT2, "available", True)
    assert not _load(tier, keys[1:2], 4)
    assert tier.stats()["load_failed.not_regular"] == 2


@pytest.mark.skipif(not fs_paths.OPENAT2.available, reason="needs openat2")
def test_a_probe_stats_in_one_openat2_without_walking_the_levels(
    tier, region, identity, monkeypatch
):
    """``size_of`` (a probe's ``stat``) opens the path with O_PATH in one openat2 call: a
    file's size, absence, and anything but a regular file (a FIFO, a symlink) are told apart
    without the ``chunk_dir`` walk, which would open each level directory."""
    keys = make_keys(identity, 3)
    _store(tier, region, keys[:1])
    fifo, link = chunk_file(tier, keys[1]), chunk_file(tier, keys[2])
    for path in (fifo, link):
        path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    link.symlink_to(chunk_file(tier, keys[0]))

    def no_walk(*args: object, **kwargs: object):
        raise AssertionError("size_of walked the level directories")

    monkeypatch.setattr(fs_files, "chunk_dir", no_walk)
    files = tier._files
    assert files.size_of(keys[0]) == HEADER_BYTES + SLOT_BYTES
    assert files.size_of(make_keys(identity, 1, seed=5)[0]) is None
    for key in keys[1:]:
        with pytest.raises(fs_paths.NotRegularError):
            files.size_of(key)


@pytest.mark.parametrize("direct", [False, True])
def test_page_cache_writes_take_turns(tier, region, identity, monkeypatch, direct):
    """At most BUFFERED_WRITERS threads write through the page cache at once (more would only
    queue for the GIL); O_DIRECT writes, which wait on the device, do not take turns."""
    files = tier._files
    monkeypatch.setattr(files, "_direct_write", lambda nbytes: direct)
    keys = make_keys(identity, 8)
    inside, most, lock, all_in = 0, 0, threading.Lock(), threading.Event()
    write = files._write

    def counting(key, reg, slot, link, is_direct):
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
            if inside == len(keys):
                all_in.set()
        all_in.wait(timeout=0.5 if not direct else 30)  # only a bound on the wait
        with lock:
            inside -= 1
        return write(key, reg, slot, link, is_direct)

    monkeypatch.setattr(files, "_write", counting)
    threads = [
        threading.Thread(target=files.write, args=(key, region, slot))
        for slot, key in enumerate(keys)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == len(keys) if direct else 1 <= most <= fs_files.BUFFERED_WRITERS
    assert all(files.size_of(key) == HEADER_BYTES + SLOT_BYTES for key in keys)
