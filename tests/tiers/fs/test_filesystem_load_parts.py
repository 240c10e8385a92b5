"""A load job of many chunks read as parts on several read threads at once, on real files.

A request that needs 8 chunks back waits for the slowest part, not for 12 reads in a row.
The job still reports once with every chunk counted as it would be alone, and afterwards its
head is the most recently used chunk, whichever part finished last.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvtier import CacheIdentity
from kvtier.config import FsTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs import reader as fs_reader
from kvtier.tiers.fs.tier import LOAD_PART_CHUNKS, LOAD_PARTS, FilesystemTier
from kvtier.tiers.shared import codec
from tests.conftest import collect, fill, holds, make_keys
from tests.tiers.fs.test_filesystem_integrity import chunk_path
from tests.tiers.fs.test_filesystem_load_many import stored_tier

N = 2 * LOAD_PART_CHUNKS  # two parts, where the tier reads two at once
SLOT_BYTES = 64 << 10  # stored_tier's


def stored(root: Path, identity: CacheIdentity, **config: Any):  # type: ignore[no-untyped-def]
    """``stored_tier`` of N chunks (and a spare slot), reading up to 2 parts of a job at once
    (the default is the CPUs but one: none on a 2-CPU machine)."""
    tier, region, keys = stored_tier(root, identity, N, spare=1, **config)
    tier.load_threads = min(2, config.get("n_read_threads", 2))
    return tier, region, keys


def wrap_reads(monkeypatch: pytest.MonkeyPatch, before) -> None:  # type: ignore[no-untyped-def]
    """Call ``before(keys)`` on the reading thread ahead of each ``ChunkReader.read_many``."""
    original = fs_reader.ChunkReader.read_many

    def read_many(self, keys, region, slots):  # type: ignore[no-untyped-def]
        before(list(keys))
        return original(self, keys, region, slots)

    monkeypatch.setattr(fs_reader.ChunkReader, "read_many", read_many)


@pytest.mark.usefixtures("fs_io")
def test_the_parts_of_a_job_are_read_at_once(
    tmp_path: Path, identity: CacheIdentity, monkeypatch: pytest.MonkeyPatch
):
    tier, region, keys = stored(tmp_path, identity)
    meet = threading.Barrier(2, timeout=10)  # broken (the job fails) unless 2 reads overlap
    parts: list[list[bytes]] = []
    wrap_reads(monkeypatch, lambda part: parts.append(part) or meet.wait())
    tier.submit_load(TransferJob(2, tuple(keys), tuple(range(N, 2 * N))))
    result = collect(tier, [2])[2]
    assert result.ok and result.succeeded == set(keys)
    assert sorted(map(len, parts)) == [LOAD_PART_CHUNKS] * 2
    assert all(holds(region, N + i, key) for i, key in enumerate(keys))
    tier.close()


@pytest.mark.usefixtures("fs_io")
def test_each_chunk_of_a_split_job_is_counted_as_it_would_be_alone(
    tmp_path: Path, identity: CacheIdentity
):
    tier, region, keys = stored(tmp_path, identity)
    damaged = chunk_path(tmp_path, identity, keys[1])
    data = bytearray(damaged.read_bytes())
    data[codec.HEADER_BYTES + 3] ^= 1
    damaged.write_bytes(bytes(data))
    chunk_path(tmp_path, identity, keys[N - 2]).unlink()
    tier.submit_load(TransferJob(2, tuple(keys), tuple(range(N, 2 * N))))
    result = collect(tier, [2])[2]
    assert result.succeeded == set(keys) - {keys[1], keys[N - 2]}
    assert result.integrity_failed == {keys[1]}
    stats = tier.stats()
    assert stats["loaded_chunks"] == N - 2
    assert stats["integrity.checksum"] == 1 and stats["load_missing"] == 1
    assert not damaged.exists()
    assert all(holds(region, N + i, key) for i, key in enumerate(keys) if key in result.succeeded)
    tier.close()


@pytest.mark.usefixtures("fs_io")
def test_the_head_ends_most_recent_whichever_part_finishes_last(
    tmp_path: Path, identity: CacheIdentity, monkeypatch: pytest.MonkeyPatch
):
    file_bytes = codec.HEADER_BYTES + SLOT_BYTES
    tier, region, keys = stored(tmp_path, identity, max_bytes=N * file_bytes)
    tail = keys[-LOAD_PART_CHUNKS]
    wrap_reads(monkeypatch, lambda part: time.sleep(0.3) if part[0] == tail else None)
    tier.submit_load(TransferJob(2, tuple(keys), tuple(range(N, 2 * N))))
    assert collect(tier, [2])[2].ok
    other = make_keys(identity, 1, seed=1)[0]
    fill(region, 2 * N, other)
    tier.submit_store(TransferJob(3, (other,), (2 * N,)))  # the bound evicts one chunk
    assert collect(tier, [3])[3].ok
    gone = [i for i, key in enumerate(keys) if not chunk_path(tmp_path, identity, key).exists()]
    assert gone == [N - 1]  # the tail: least recently used of the prefix
    tier.close()


def test_with_one_read_thread_a_job_is_read_whole(
    tmp_path: Path, identity: CacheIdentity, monkeypatch: pytest.MonkeyPatch
):
    tier, _region, keys = stored(tmp_path, identity, n_read_threads=1)
    parts: list[list[bytes]] = []
    wrap_reads(monkeypatch, parts.append)
    tier.submit_load(TransferJob(2, tuple(keys), tuple(range(N, 2 * N))))
    assert collect(tier, [2])[2].ok
    assert parts == [keys]
    tier.close()


def test_a_job_is_read_in_as_many_parts_as_spare_cpus_and_read_threads_allow(
    tmp_path: Path, identity: CacheIdentity
):
    region = HostRegion(4, SLOT_BYTES)
    for threads in (1, 2, 64):
        config = FsTierConfig(root_dir=str(tmp_path / str(threads)), n_read_threads=threads)
        tier = FilesystemTier(config, region, identity)
        assert tier.load_threads == min(threads, LOAD_PARTS)
        assert tier.load_part_chunks == LOAD_PART_CHUNKS
        tier.close()
