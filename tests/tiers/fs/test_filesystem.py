"""The filesystem tier on real files: layout, lookups, restart, capacity, faults, disk full."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvtier import CacheIdentity, ChunkKey
from kvtier.config import FsTierConfig
from kvtier.errors import ConfigError, TierError
from kvtier.region import HostRegion
from kvtier.tiers.base import HIT, MISS, RETRY, TransferJob
from kvtier.tiers.fs import index as fs_index
from kvtier.tiers.fs.files import ChunkFiles
from kvtier.tiers.fs.scan import HOST_TAG, STALE_TMP_S
from kvtier.tiers.fs.tier import FilesystemTier
from kvtier.tiers.shared.codec import HEADER_BYTES
from tests.conftest import collect, fill, holds, make_keys, settle_lookup, wait_for

#: Every test runs with the compiled chunk-file I/O and with the os-module path.
pytestmark = pytest.mark.usefixtures("fs_io")

MakeTier = Callable[..., FilesystemTier]


@pytest.fixture
def region(identity: CacheIdentity) -> HostRegion:
    return HostRegion(32, identity.layout.chunk_bytes)


@pytest.fixture
def make_tier(tmp_path: Path, region: HostRegion, identity: CacheIdentity) -> Iterator[MakeTier]:
    """Builds tiers over ``tmp_path / "cache"`` (by default); closes them all at the end."""
    tiers: list[FilesystemTier] = []

    def make(
        root: Path | None = None,
        *,
        reg: HostRegion | None = None,
        ident: CacheIdentity | None = None,
        **options: object,
    ) -> FilesystemTier:
        config = FsTierConfig(root_dir=str(root or tmp_path / "cache"), **options)  # type: ignore[arg-type]
        tiers.append(FilesystemTier(config, reg or region, ident or identity))
        return tiers[-1]

    yield make
    for tier in tiers:
        tier.close()


def store(tier: FilesystemTier, region: HostRegion, keys: list[ChunkKey], job_id: int = 1) -> bool:
    slots = tuple(range(len(keys)))
    for key, slot in zip(keys, slots, strict=True):
        fill(region, slot, key)
    tier.submit_store(TransferJob(job_id, tuple(keys), slots))
    return collect(tier, [job_id])[job_id].ok


def load(tier: FilesystemTier, keys: list[ChunkKey], job_id: int = 2, first_slot: int = 16):
    tier.submit_load(
        TransferJob(job_id, tuple(keys), tuple(range(first_slot, first_slot + len(keys))))
    )
    return collect(tier, [job_id])[job_id]


def chunk_files(tier: FilesystemTier) -> dict[ChunkKey, Path]:
    return {ChunkKey(bytes.fromhex(p.name)): p for p in Path(tier.namespace).glob("??/??/*")}


PIECE_BYTES = 256 << 10  # damage lands at several depths of a multi-page payload


# -- layout and lookups ----------------------------------------------------------------------
@pytest.mark.parametrize("o_direct", ["off", "on"])
@pytest.mark.parametrize("slot_bytes", [4096, 5000, 3 * PIECE_BYTES - 1000])
def test_round_trip_and_on_disk_layout(make_tier, identity, tmp_path, o_direct, slot_bytes):
    """Chunks land as <ns>/<ab>/<cd>/<key hex>, header + payload exactly, and load back intact,
    buffered or O_DIRECT, with slots that are or are not a multiple of 4096 bytes, in one piece
    or several."""
    reg = HostRegion(32, slot_bytes)
    try:
        tier = make_tier(reg=reg, o_direct=o_direct)
    except TierError:
        pytest.skip("this filesystem refuses O_DIRECT")
    keys = make_keys(identity, 3)
    assert store(tier, reg, keys)
    namespace = tmp_path / "cache" / identity.hexdigest
    for key in keys:
        path = namespace / key.hex()[:2] / key.hex()[2:4] / key.hex()
        assert path.stat().st_size == HEADER_BYTES + slot_bytes
    description = json.loads((namespace / "identity.json").read_text())
    assert description["identity"]["model"] == "test/model"
    result = load(tier, keys)
    assert result.succeeded == frozenset(keys)
    assert all(holds(reg, 16 + i, key) for i, key in enumerate(keys))
    assert tier.stats()["loaded_bytes"] == 3 * (HEADER_BYTES + slot_bytes)


@pytest.mark.parametrize(
    ("offset", "new_size", "reason"),
    [
        (HEADER_BYTES + 2 * PIECE_BYTES + 7, None, "checksum"),  # a byte of the last piece
        (None, HEADER_BYTES + PIECE_BYTES + 100, "length"),  # cut inside the second piece
        (None, HEADER_BYTES + PIECE_BYTES, "length"),  # cut exactly at a piece boundary
    ],
)
def test_damage_in_a_later_piece_is_detected(make_tier, identity, offset, new_size, reason):
    reg = HostRegion(4, 3 * PIECE_BYTES - 1000)
    tier = make_tier(reg=reg, o_direct="off")
    keys = make_keys(identity, 1)
    assert store(tier, reg, keys)
    path = chunk_files(tier)[keys[0]]
    with open(path, "r+b") as file:
        if offset is not None:
            file.seek(offset)
            byte = file.read(1)
            file.seek(offset)
            file.write(bytes([byte[0] ^ 0x10]))
        if new_size is not None:
            file.truncate(new_size)
    assert load(tier, keys, first_slot=1).integrity_failed == frozenset(keys)
    assert tier.stats()[f"integrity.{reason}"] == 1
    assert not path.exists()


@pytest.mark.parametrize("probe", ["inline", "background"])
def test_lookup_answers_known_keys_at_once_and_probes_unknown_ones(
    make_tier, region, identity, probe
):
    """Own stores are HIT at once; an unknown key is MISS at once when probed inline, RETRY
    then MISS when probed in the background; once another instance writes it and the negative
    answer expires, it becomes HIT."""
    tier = make_tier(negative_ttl_s=0.05, probe=probe)
    mine, theirs = make_keys(identity, 2, seed=1), make_keys(identity, 1, seed=2)
    store(tier, region, mine)
    assert [tier.lookup(k) for k in mine] == [HIT, HIT]
    assert tier.lookup(theirs[0]) is (MISS if probe == "inline" else RETRY)
    assert settle_lookup(tier, theirs[0]) is MISS
    assert tier.stats()["inline_probes"] == (probe == "inline")
    other = make_tier()
    store(other, region, theirs, job_id=5)
    wait_for(lambda: tier.lookup(theirs[0]) is HIT)
    assert tier.stats()["probe_hits"] >= 1 and tier.stats()["probe_misses"] >= 1


def test_other_identity_never_sees_the_chunks(make_tier, region, identity, layout):
    tier = make_tier()
    keys = make_keys(identity, 2)
    store(tier, region, keys)
    stranger = make_tier(ident=CacheIdentity(model="other/model", layout=layout))
    assert stranger.namespace != tier.namespace
    assert [settle_lookup(stranger, k) for k in keys] == [MISS, MISS]
    assert load(stranger, keys).succeeded == frozenset()


def test_unwritable_root_dir_is_a_clear_error_at_start(make_tier, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(TierError, match="root_dir"):
        make_tier(blocker / "cache")


def test_max_bytes_below_one_chunk_is_a_config_error(make_tier):
    with pytest.raises(ConfigError, match="max_bytes"):
        make_tier(max_bytes=100)


# -- restart and capacity --------------------------------------------------------------------
def test_restarted_tier_finds_and_serves_the_old_chunks(make_tier, region, identity):
    """A new instance rebuilds its index from the directory: HIT without probing, loads intact."""
    old = make_tier()
    keys = make_keys(identity, 6)
    store(old, region, keys)
    old.close()
    new = make_tier()
    assert new.wait_scanned(timeout=10)
    assert new.stats()["index_chunks"] == 6
    assert [new.lookup(k) for k in keys] == [HIT] * 6
    assert load(new, keys).succeeded == frozenset(keys)


def test_a_load_stamps_the_use_in_the_mtime_once_a_minute_and_a_store_counts_as_one(
    make_tier, region, identity
):
    """The mtime is a chunk's last use (``kvtier cache``, a restart's scan): a load writes it,
    unless this instance stamped the chunk within ``USE_STAMP_S``; a store stamps it, so a load
    soon after its store costs no ``utime``."""
    hour_ago = time.time() - 3600
    writer = make_tier()
    keys = make_keys(identity, 2)
    store(writer, region, keys)
    files = chunk_files(writer)
    for path in files.values():
        os.utime(path, (hour_ago, hour_ago))
    assert load(writer, keys[:1]).ok
    assert files[keys[0]].stat().st_mtime == hour_ago, "stored just now: no second stamp"
    writer.close()
    reader = make_tier()  # another instance: it has stamped nothing
    assert reader.wait_scanned(timeout=10)
    assert load(reader, keys).ok
    assert all(path.stat().st_mtime > hour_ago + 3000 for path in files.values())
    os.utime(files[keys[1]], (hour_ago, hour_ago))
    assert load(reader, keys[1:], job_id=3).ok
    assert files[keys[1]].stat().st_mtime == hour_ago, "stamped within the minute: not again"


def test_a_use_stamp_is_due_again_only_once_its_interval_has_passed(monkeypatch, identity):
    """``UseStamps`` on both sides of ``interval_s``, a store's stamp (``written``) counting like
    a load's; the clock is faked."""
    now = [1000.0]
    monkeypatch.setattr(fs_index.time, "monotonic", lambda: now[0])
    stamps = fs_index.UseStamps(60.0)
    key, stored = make_keys(identity, 2)
    assert stamps.due(key) and not stamps.due(key)
    stamps.written(stored)
    now[0] += 59.9
    assert not stamps.due(key) and not stamps.due(stored)
    now[0] += 0.2
    assert stamps.due(key) and stamps.due(stored)


def test_capacity_evicts_the_coldest_and_stays_under_max_bytes(make_tier, region, identity):
    """Ten chunks fill max_bytes; key 0 is read again; five more stores evict keys 1..5."""
    file_bytes = HEADER_BYTES + region.slot_bytes
    tier = make_tier(max_bytes=10 * file_bytes)
    keys = make_keys(identity, 15)
    for i, key in enumerate(keys[:10]):
        assert store(tier, region, [key], job_id=i)
    assert load(tier, keys[:1], job_id=100).ok
    for i, key in enumerate(keys[10:]):
        assert store(tier, region, [key], job_id=200 + i)
        assert sum(p.stat().st_size for p in chunk_files(tier).values()) <= 10 * file_bytes
    assert set(chunk_files(tier)) == {keys[0], *keys[6:]}
    assert tier.take_removed() == keys[1:6]
    assert tier.stats()["evicted"] == 5
    assert [settle_lookup(tier, k) for k in keys[1:3]] == [MISS, MISS]


def test_restart_with_a_smaller_bound_evicts_the_oldest_files(make_tier, region, identity):
    first = make_tier()
    keys = make_keys(identity, 8)
    store(first, region, keys)
    first.close()
    for age, path in enumerate(chunk_files(first)[k] for k in reversed(keys)):
        os.utime(path, (1e9 - age, 1e9 - age))  # keys[0] oldest
    tier = make_tier(max_bytes=5 * (HEADER_BYTES + region.slot_bytes))
    assert tier.wait_scanned(timeout=10)
    assert set(chunk_files(tier)) == set(keys[3:])


def test_a_chunk_evicted_while_the_start_up_scan_runs_is_evicted_once(
    make_tier, region, identity, monkeypatch
):
    """The scan lists key 0, then a store evicts it before the scan is merged: the merge
    must not index it again (it would be deleted and counted a second time)."""
    first_stored, scanned, second_stored = threading.Event(), threading.Event(), threading.Event()
    scan = ChunkFiles.scan

    def scan_between_the_stores(self: ChunkFiles, stop: threading.Event) -> object:
        first_stored.wait(10)
        result = scan(self, stop)
        scanned.set()
        second_stored.wait(10)
        return result

    monkeypatch.setattr(ChunkFiles, "scan", scan_between_the_stores)
    tier = make_tier(max_bytes=HEADER_BYTES + region.slot_bytes)
    keys = make_keys(identity, 2)
    assert store(tier, region, keys[:1], job_id=1)
    first_stored.set()
    assert scanned.wait(10)
    assert store(tier, region, keys[1:], job_id=2)
    second_stored.set()
    assert tier.wait_scanned(timeout=10)
    assert (tier.stats()["evicted"], tier.take_removed()) == (1, [keys[0]])
    assert set(chunk_files(tier)) == {keys[1]}
    assert [settle_lookup(tier, k) for k in keys] == [MISS, HIT]


def test_a_probe_whose_file_this_tier_deleted_meanwhile_is_a_miss_and_evicts_nothing(
    make_tier, region, identity, monkeypatch
):
    """Key 0, written by another instance, is probed; before the probe's answer this tier
    stores and then evicts it. Indexed on the probe's word, it would evict the live key 1 for a
    file that is gone: it is a miss (``probe_raced_delete``), and key 1 stays."""
    stat_done, release = threading.Event(), threading.Event()
    size_of, keys = ChunkFiles.size_of, make_keys(identity, 2)

    def stat_then_wait(self: ChunkFiles, key: ChunkKey) -> int | None:
        size = size_of(self, key)
        if key == keys[0] and not stat_done.is_set():
            stat_done.set()
            release.wait(10)
        return size

    tier = make_tier(max_bytes=HEADER_BYTES + region.slot_bytes, probe="background")
    assert tier.wait_scanned(timeout=10)
    assert store(make_tier(), region, keys[:1])  # another instance writes key 0
    monkeypatch.setattr(ChunkFiles, "size_of", stat_then_wait)
    assert tier.lookup(keys[0]) is RETRY
    assert stat_done.wait(10)  # the probe saw the file
    assert store(tier, region, keys[:1], job_id=2) and store(tier, region, keys[1:], job_id=3)
    assert tier.take_removed() == [keys[0]]
    release.set()
    assert settle_lookup(tier, keys[0]) is MISS
    assert tier.stats()["probe_raced_delete"] == 1
    assert set(chunk_files(tier)) == {keys[1]}
    assert settle_lookup(tier, keys[1]) is HIT


def test_a_probe_between_an_eviction_and_its_unlink_is_a_miss_and_evicts_nothing(
    make_tier, region, identity, monkeypatch
):
    """Key 0 is evicted by a store of key 1; before its file is unlinked, a lookup's probe
    finds it still there. The probe began after the eviction, yet must not index it: it is a
    miss, and key 1 stays."""
    removing, unlink = threading.Event(), threading.Event()
    remove, keys = ChunkFiles.remove, make_keys(identity, 2)

    def slow_remove(self: ChunkFiles, key: ChunkKey) -> bool:
        if key == keys[0]:
            removing.set()
            unlink.wait(10)
        return remove(self, key)

    monkeypatch.setattr(ChunkFiles, "remove", slow_remove)
    tier = make_tier(max_bytes=HEADER_BYTES + region.slot_bytes, probe="background")
    assert tier.wait_scanned(timeout=10) and store(tier, region, keys[:1])
    second = threading.Thread(target=store, args=(tier, region, keys[1:], 2))
    second.start()
    try:
        assert removing.wait(10)  # key 0 evicted, its file still there
        assert settle_lookup(tier, keys[0]) is MISS
        assert tier.stats()["probe_raced_delete"] == 1
    finally:
        unlink.set()
        second.join(10)
    assert set(chunk_files(tier)) == {keys[1]}
    assert settle_lookup(tier, keys[1]) is HIT


def test_an_evicted_chunk_written_again_by_another_instance_is_found_by_a_probe(
    make_tier, region, identity
):
    """Once its delete has ended, an evicted key is no longer skipped: another instance may
    write it again, and a probe finds it."""
    keys = make_keys(identity, 2)
    tier = make_tier(max_bytes=HEADER_BYTES + region.slot_bytes, probe="background")
    assert tier.wait_scanned(timeout=10)
    assert store(tier, region, keys[:1]) and store(tier, region, keys[1:], job_id=2)
    assert tier.take_removed() == [keys[0]]
    assert store(make_tier(), region, keys[:1], job_id=3)  # another instance writes key 0
    assert settle_lookup(tier, keys[0]) is HIT
    assert tier.stats().get("probe_raced_delete", 0) == 0


def test_scrub_removes_only_temporary_files_of_dead_or_stale_writers(make_tier, tmp_path, identity):
    live_tier = make_tier()
    level = Path(live_tier.namespace) / "ab" / "cd"
    level.mkdir(parents=True)
    pid = os.getpid()
    live = level / f"{'ab' * 32}.{HOST_TAG}-{pid}-0000beef-1.tmp"
    stale = level / f"{'ab' * 32}.{HOST_TAG}-{pid}-0000dead-1.tmp"
    dead = level / f"{'ab' * 32}.{HOST_TAG}-{_dead_pid()}-0000cafe-1.tmp"
    for path in (live, stale, dead):
        path.write_bytes(b"partial")
    os.utime(stale, (0, os.path.getmtime(stale) - STALE_TMP_S - 1))
    tier = make_tier()
    assert tier.wait_scanned(timeout=10)
    assert sorted(level.iterdir()) == [live]
    assert tier.stats()["scrubbed_tmp_files"] == 2


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


# -- failures --------------------------------------------------------------------------------
def test_missing_file_is_a_plain_miss(make_tier, region, identity):
    tier = make_tier()
    keys = make_keys(identity, 2)
    store(tier, region, keys)
    chunk_files(tier)[keys[1]].unlink()
    result = load(tier, keys)
    assert result.succeeded == {keys[0]} and result.integrity_failed == frozenset()
    stats = tier.stats()
    assert stats["load_missing"] == 1 and not any(k.startswith("integrity") for k in stats)


def test_storing_again_rewrites_a_file_another_instance_deleted(make_tier, region, identity):
    tier = make_tier()
    keys = make_keys(identity, 2)
    store(tier, region, keys)
    chunk_files(tier)[keys[0]].unlink()
    assert store(tier, region, keys, job_id=3)
    assert set(chunk_files(tier)) == set(keys)
    assert tier.stats()["store_skipped_present"] == 1
    assert load(tier, keys, job_id=4).succeeded == frozenset(keys)


def test_store_failure_fails_the_job_and_loads_keep_working(make_tier, region, identity):
    """An injected ENOSPC fails the store job, leaves no file behind, and is counted."""
    tier = make_tier()
    before, after = make_keys(identity, 2, seed=1), make_keys(identity, 2, seed=2)
    store(tier, region, before)

    def disk_full(op: str, key: ChunkKey) -> None:
        if op == "store":
            raise OSError(errno.ENOSPC, "No space left on device")

    tier.fault_hook = disk_full
    assert not store(tier, region, after, job_id=3)
    assert tier.stats()["store_failed.ENOSPC"] == 1
    assert set(chunk_files(tier)) == set(before)
    assert list(Path(tier.namespace).rglob("*.tmp")) == []
    assert load(tier, before, job_id=4).succeeded == frozenset(before)


def test_read_error_is_a_miss_that_keeps_the_file(make_tier, region, identity):
    tier = make_tier()
    keys = make_keys(identity, 1)
    store(tier, region, keys)

    def broken_disk(op: str, key: ChunkKey) -> None:
        raise OSError(errno.EIO, "Input/output error")

    tier.fault_hook = broken_disk
    assert load(tier, keys, job_id=2).succeeded == frozenset()
    assert tier.stats()["load_failed.EIO"] == 1
    tier.fault_hook = None
    assert load(tier, keys, job_id=3).succeeded == frozenset(keys)


def test_min_free_bytes_stops_stores_before_the_disk_fills(make_tier, region, identity):
    writer = make_tier(min_free_bytes=0)
    keys = make_keys(identity, 2)
    store(writer, region, keys)
    careful = make_tier(min_free_bytes=1 << 62)
    assert not store(careful, region, make_keys(identity, 1, seed=7), job_id=3)
    assert careful.stats()["store_failed.ENOSPC"] == 1
    assert load(careful, keys, job_id=4).succeeded == frozenset(keys)


def test_loads_are_not_stuck_behind_queued_stores(make_tier, region, identity):
    """With every writer blocked and more store jobs queued, a load still completes."""
    tier = make_tier(n_read_threads=1, n_write_threads=1)
    stored = make_keys(identity, 1, seed=1)
    store(tier, region, stored)
    release = threading.Event()
    tier.fault_hook = lambda op, key: release.wait(10) if op == "store" else None
    for job in range(4):
        tier.submit_store(
            TransferJob(10 + job, tuple(make_keys(identity, 1, seed=20 + job)), (job,))
        )
    result = load(tier, stored, job_id=50)
    assert result.succeeded == frozenset(stored)
    assert tier.get_finished_jobs() == []  # no store has finished yet
    release.set()
    assert all(r.ok for r in collect(tier, range(10, 14)).values())


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_full_filesystem_fails_stores_cleanly(make_tier, small_tmpfs, region, identity):
    """On a 256 KiB tmpfs, stores fail with ENOSPC once it is full; what was stored loads."""
    tier = make_tier(small_tmpfs, min_free_bytes=0)
    keys = make_keys(identity, 64)
    stored = [k for i, k in enumerate(keys) if store(tier, region, [k], job_id=i)]
    assert 0 < len(stored) < len(keys)
    assert tier.stats()["store_failed.ENOSPC"] >= 1
    assert list(small_tmpfs.rglob("*.tmp")) == []
    assert set(chunk_files(tier)) == set(stored)
    for start in range(0, len(stored), 16):
        part = stored[start : start + 16]
        assert load(tier, part, job_id=1000 + start).succeeded == frozenset(part)
