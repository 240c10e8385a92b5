"""O_DIRECT and the host rows: ``o_direct: "on"`` needs rows aligned to 4096 bytes.

O_DIRECT reads and writes a host slot in place, so the slot must start on a 4096-byte boundary
and span whole pages. kvtier's own ``HostRegion`` always does; vLLM's rows (``PrimaryRegion``)
may not. ``"on"`` over such rows would start, then fail every store with EINVAL: it is refused
at start, naming the key and why. ``"auto"`` falls back to the page cache.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier import CacheIdentity
from kvtier.config import FsTierConfig
from kvtier.errors import ConfigError, TierError
from kvtier.integrations.vllm.region import PrimaryRegion
from kvtier.region import ALIGNMENT, HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs.files import O_DIRECT
from kvtier.tiers.fs.tier import FilesystemTier
from tests.conftest import collect, fill, holds, make_keys

pytestmark = [
    pytest.mark.usefixtures("fs_io"),
    pytest.mark.skipif(not O_DIRECT, reason="no O_DIRECT on this platform"),
]


def vllm_rows(num_rows: int, row_bytes: int, offset: int = 0) -> PrimaryRegion:
    """vLLM's primary view: ``num_rows`` rows of ``row_bytes`` over page-aligned memory,
    starting ``offset`` bytes in."""
    memory = mmap.mmap(-1, offset + num_rows * row_bytes)
    view = memoryview(memory)[offset : offset + num_rows * row_bytes]
    return PrimaryRegion(view.cast("b", (num_rows, row_bytes)))


@pytest.fixture
def tiers() -> Iterator[list[FilesystemTier]]:
    made: list[FilesystemTier] = []
    yield made
    for tier in made:
        tier.close()


def round_trip(tier: FilesystemTier, region: HostRegion, identity: CacheIdentity) -> bool:
    keys = make_keys(identity, 2)
    for slot, key in enumerate(keys):
        fill(region, slot, key)
    tier.submit_store(TransferJob(1, tuple(keys), (0, 1)))
    stored = collect(tier, [1])[1].ok
    tier.submit_load(TransferJob(2, tuple(keys), (2, 3)))
    loaded = collect(tier, [2])[2].ok
    return stored and loaded and holds(region, 2, keys[0]) and holds(region, 3, keys[1])


@pytest.mark.parametrize(
    ("row_bytes", "offset", "why"),
    [(ALIGNMENT + 512, 0, "4608 bytes apart"), (2 * ALIGNMENT, 512, "start 512 bytes past")],
)
def test_on_over_unaligned_rows_is_refused_at_start(
    tmp_path: Path, identity, row_bytes, offset, why
):
    region = vllm_rows(4, row_bytes, offset)
    config = FsTierConfig(root_dir=str(tmp_path), o_direct="on")
    with pytest.raises(ConfigError, match=rf'^o_direct: "on" needs host rows .*{why}.*"auto"'):
        FilesystemTier(config, region, identity)
    region.release()


def test_auto_over_unaligned_rows_uses_the_page_cache(tmp_path: Path, identity, tiers):
    region = vllm_rows(4, identity.layout.chunk_bytes + 512)  # not a multiple of 4096
    tiers.append(FilesystemTier(FsTierConfig(root_dir=str(tmp_path)), region, identity))
    assert tiers[0].stats()["o_direct"] == 0
    assert round_trip(tiers[0], region, identity)


def test_on_over_aligned_rows_starts_and_stores(tmp_path: Path, identity, tiers):
    for region in (HostRegion(4, identity.layout.chunk_bytes), vllm_rows(4, 2 * ALIGNMENT)):
        config = FsTierConfig(root_dir=str(tmp_path / str(len(tiers))), o_direct="on")
        try:
            tiers.append(FilesystemTier(config, region, identity))
        except TierError as exc:
            if "does not allow O_DIRECT" in str(exc):
                pytest.skip("this file system refuses O_DIRECT")
            raise
        assert tiers[-1].stats()["o_direct"] == 1
        assert round_trip(tiers[-1], region, identity)
