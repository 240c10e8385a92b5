"""Which path each load of the fs tier takes: ``read_path.page_cache`` or ``read_path.o_direct``.

With ``o_direct: "auto"`` a chunk wholly in the page cache is read through it and any other
chunk with O_DIRECT (``page_cache``). Every read is correct either way, so only the counters
show a choice made the wrong way round (issue 29: an inverted answer passed every test).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier import CacheIdentity, ChunkKey
from kvtier.config import FsTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs import page_cache
from kvtier.tiers.fs.files import O_DIRECT
from kvtier.tiers.fs.page_cache import CACHESTAT, PAGE, CacheStat
from kvtier.tiers.fs.tier import FilesystemTier
from kvtier.tiers.shared.codec import HEADER_BYTES
from tests.conftest import collect, fill, holds, make_keys
from tests.tiers.fs.chunk_files import chunk_file, drop_page_cache

#: Every test runs with the compiled chunk-file I/O and with the os-module path.
pytestmark = pytest.mark.usefixtures("fs_io")

SLOT_BYTES = 64 << 10
FILE_BYTES = HEADER_BYTES + SLOT_BYTES  # a whole number of pages


@pytest.fixture
def region() -> HostRegion:
    return HostRegion(8, SLOT_BYTES)


@pytest.fixture
def make_tier(tmp_path: Path, region: HostRegion, identity: CacheIdentity) -> Iterator:
    made: list[FilesystemTier] = []

    def make(o_direct: str) -> FilesystemTier:
        config = FsTierConfig(root_dir=str(tmp_path / "cache"), o_direct=o_direct)
        tier = FilesystemTier(config, region, identity)
        tier.wait_scanned()
        made.append(tier)
        return tier

    yield make
    for tier in made:
        tier.close()


def _store(tier: FilesystemTier, region: HostRegion, keys: list[ChunkKey]) -> None:
    for slot, key in enumerate(keys):
        fill(region, slot, key)
    tier.submit_store(TransferJob(1, tuple(keys), tuple(range(len(keys)))))
    assert collect(tier, [1])[1].ok


def _load(tier: FilesystemTier, region: HostRegion, keys: list[ChunkKey], job_id: int) -> None:
    slots = tuple(range(4, 4 + len(keys)))
    tier.submit_load(TransferJob(job_id, tuple(keys), slots))
    assert collect(tier, [job_id])[job_id].ok
    assert all(holds(region, slot, key) for slot, key in zip(slots, keys))


def _cache(path: Path, but_last: bool = False) -> None:
    """Bring all of ``path`` into the page cache (``but_last``: then drop its last page)."""
    path.read_bytes()
    if but_last:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # a dirty page is not dropped
            os.posix_fadvise(fd, FILE_BYTES - PAGE, PAGE, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _paths(tier: FilesystemTier) -> tuple[int, int]:
    stats = tier.stats()
    return stats["read_path.page_cache"], stats["read_path.o_direct"]


def _auto(make_tier) -> FilesystemTier:
    tier = make_tier("auto")
    if not (tier.o_direct and CACHESTAT.available):
        pytest.skip("no O_DIRECT or no cachestat here: 'auto' is plain O_DIRECT")
    assert tier._files.adaptive, "O_DIRECT and cachestat: 'auto' chooses chunk by chunk"
    return tier


def test_auto_reads_cached_chunks_through_the_page_cache_and_cold_ones_with_o_direct(
    make_tier, region, identity
):
    tier = _auto(make_tier)
    keys = make_keys(identity, 3)
    _store(tier, region, keys)
    assert _paths(tier) == (0, 0)
    cached, cold, partly = (chunk_file(tier, key) for key in keys)
    _cache(cached)
    drop_page_cache(cold)
    _cache(partly, but_last=True)  # every page but the last: not wholly cached
    _load(tier, region, keys[:1], 2)
    assert _paths(tier) == (1, 0)
    _load(tier, region, keys[1:2], 3)
    assert _paths(tier) == (1, 1)
    _load(tier, region, keys[2:], 4)
    assert _paths(tier) == (1, 2)
    _cache(cold)  # now wholly cached: the page cache
    _load(tier, region, keys[1:2], 5)
    assert _paths(tier) == (2, 2)
    assert tier.stats()["loaded_chunks"] == 4


@pytest.mark.skipif(not O_DIRECT, reason="no O_DIRECT on this platform")
@pytest.mark.parametrize(("o_direct", "expected"), [("on", (0, 2)), ("off", (2, 0))])
def test_on_and_off_read_one_way_whatever_is_cached(
    make_tier, region, identity, o_direct, expected
):
    tier = make_tier(o_direct)
    if o_direct == "on" and not tier.o_direct:
        pytest.skip("this file system refuses O_DIRECT")
    keys = make_keys(identity, 2)
    _store(tier, region, keys)
    _cache(chunk_file(tier, keys[0]))
    drop_page_cache(chunk_file(tier, keys[1]))
    _load(tier, region, keys, 2)
    assert _paths(tier) == expected


@pytest.mark.parametrize(
    ("size", "pages", "cached"),
    [(3 * PAGE, 3, True), (3 * PAGE, 2, False), (3 * PAGE, 4, True),
     (3 * PAGE + 1, 3, False), (3 * PAGE + 1, 4, True), (3 * PAGE, None, False),
     (0, 0, True)],
)  # fmt: skip
def test_a_chunk_is_cached_only_when_every_page_is(monkeypatch, size, pages, cached):
    stat = CacheStat()
    monkeypatch.setattr(stat, "cached_pages", lambda fd: pages)
    assert stat.is_cached(-1, size) is cached


def test_the_process_cachestat_is_the_one_the_reads_ask():
    """The os-module path asks ``page_cache.CACHESTAT``: one probe per process."""
    assert page_cache.CACHESTAT is CACHESTAT
