"""The filesystem tier against a hostile or broken cache directory, on real files.

FIFOs, sockets, devices, directories and symlinks where chunk files belong; symlink loops and
unreadable directories in the start-up scan; a restart on a full disk. None of them may hang a
thread, abort the scan, follow a link out of the root, or keep the tier from starting.

A test that meets a FIFO must not hang the suite even when the tier would block on it: every
tier or manager here is closed by ``close_unjammed``, which opens each FIFO for writing (which
releases a blocked reader) until ``close`` returns, and fails if it does not within a deadline.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from kvtier import CacheIdentity, ChunkKey, TieringManager
from kvtier.config import FsTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import SecondaryTier, TransferJob
from kvtier.tiers.registry import build_tier
from kvtier.tiers.shared.codec import HEADER_BYTES
from tests.conftest import collect, config, fill, holds, make_keys, settle, store

#: Every test runs with the compiled chunk-file I/O and with the os-module path.
pytestmark = pytest.mark.usefixtures("fs_io")

DEADLINE_S = 20.0


# -- helpers ---------------------------------------------------------------------------------
def chunk_path(root: Path, identity: CacheIdentity, key: ChunkKey) -> Path:
    name = key.hex()
    return root / identity.hexdigest / name[:2] / name[2:4] / name


def make_fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def unjam(paths: list[Path]) -> None:
    """Release every reader blocked opening one of ``paths`` (a FIFO with a writer opens)."""
    for path in paths:
        with suppress(OSError):  # replaced or removed meanwhile: nobody is blocked on it
            os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW))


def close_unjammed(closable: Any, fifos: list[Path], what: str = "close()") -> None:
    """Close ``closable`` in a thread; fail if it has not returned within ``DEADLINE_S``.

    Meanwhile keep releasing readers blocked on ``fifos``, so that a tier that hangs on them
    still lets the test (and the interpreter, which joins pool threads at exit) finish.
    """
    closer = threading.Thread(target=closable.close, daemon=True)
    closer.start()
    closer.join(DEADLINE_S)
    hung = closer.is_alive()
    while closer.is_alive():
        unjam(fifos)
        closer.join(0.05)
    assert not hung, f"{what} did not return within {DEADLINE_S} s"


def store_through(manager: TieringManager, keys: list[ChunkKey]) -> None:
    store(manager, keys)
    assert manager.wait_idle(timeout=DEADLINE_S)


def fs_tiers(root: Path, **options: object) -> list[dict[str, object]]:
    return [{"type": "fs", "root_dir": str(root), "name": "disk", "min_free_bytes": 0, **options}]


def disk_stats(manager: TieringManager) -> dict[str, int]:
    stats: dict[str, int] = manager.stats()["tiers"]["disk"]
    return stats


def file_bytes(identity: CacheIdentity) -> int:
    return HEADER_BYTES + identity.layout.chunk_bytes


def seed_cache(root: Path, identity: CacheIdentity, keys: list[ChunkKey]) -> None:
    """Store ``keys``, each the head of a prefix of its own, through a manager that is then
    closed; oldest file: ``keys[0]``."""
    with TieringManager(config(16, secondary_tiers=fs_tiers(root)), identity) as manager:
        for key in keys:
            store_through(manager, [key])
    for age, key in enumerate(reversed(keys)):
        os.utime(chunk_path(root, identity, key), (1e9 - age, 1e9 - age))


@pytest.fixture
def fifos() -> Iterator[list[Path]]:
    """FIFOs a test made; released once more at the end, whatever happened."""
    made: list[Path] = []
    yield made
    unjam(made)


@pytest.fixture
def make_tier(
    tmp_path: Path, identity: CacheIdentity, fifos: list[Path]
) -> Iterator[Callable[..., tuple[SecondaryTier, HostRegion]]]:
    """Builds fs tiers through the registry over ``tmp_path / "cache"``; closes them unjammed."""
    built: list[SecondaryTier] = []

    def make(**options: Any) -> tuple[SecondaryTier, HostRegion]:
        region = HostRegion(32, identity.layout.chunk_bytes)
        options.setdefault("min_free_bytes", 0)
        tier_config = FsTierConfig(root_dir=str(tmp_path / "cache"), **options)
        built.append(build_tier(tier_config, region, identity))
        return built[-1], region

    yield make
    for tier in built:
        close_unjammed(tier, fifos)


# -- item 3: non-regular files at chunk paths ------------------------------------------------
def test_fifos_at_chunk_paths_fail_their_keys_without_stopping_good_loads_or_close(
    make_tier, tmp_path, identity, fifos
):
    """More FIFOs than reader threads: each FIFO's load fails (counted), the good chunks still
    load, and close() returns."""
    tier, region = make_tier(n_read_threads=2)
    good, hostile = make_keys(identity, 2, seed=1), make_keys(identity, 6, seed=2)
    for slot, key in enumerate(good):
        fill(region, slot, key)
    tier.submit_store(TransferJob(1, tuple(good), (0, 1)))
    assert collect(tier, [1], timeout=DEADLINE_S)[1].ok
    fifos.extend(make_fifo(chunk_path(tmp_path / "cache", identity, k)) for k in hostile)
    for job_id, key in enumerate(hostile, start=10):
        tier.submit_load(TransferJob(job_id, (key,), (job_id,)))
    tier.submit_load(TransferJob(2, tuple(good), (2, 3)))
    results = collect(tier, [2, *range(10, 16)], timeout=DEADLINE_S)
    assert results[2].succeeded == frozenset(good)
    assert holds(region, 2, good[0]) and holds(region, 3, good[1])
    assert all(results[j].failed and not results[j].integrity_failed for j in range(10, 16))
    assert tier.stats()["load_failed.not_regular"] == 6
    assert all(stat.S_ISFIFO(p.lstat().st_mode) for p in fifos)  # left alone, not deleted
    close_unjammed(tier, fifos)


def _fifo(path: Path, outside: Path) -> None:
    make_fifo(path)


def _socket(path: Path, outside: Path) -> None:
    os.mknod(path, stat.S_IFSOCK | 0o600)


def _device(path: Path, outside: Path) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # what /dev/null is
    except PermissionError:
        pytest.skip("cannot make a device node here")


def _directory(path: Path, outside: Path) -> None:
    path.mkdir()


def _symlink_out_of_root(path: Path, outside: Path) -> None:
    """A link to a valid chunk of the same key outside the root: never followed."""
    os.symlink(outside, path)


def _symlink_loop(path: Path, outside: Path) -> None:
    os.symlink(path.name, path)


NON_REGULAR: dict[str, Callable[[Path, Path], None]] = {
    "fifo": _fifo,
    "socket": _socket,
    "device": _device,
    "directory": _directory,
    "symlink out of the root": _symlink_out_of_root,
    "symlink loop": _symlink_loop,
}


@pytest.mark.parametrize("probe", ["inline", "background"])
@pytest.mark.parametrize("kind", list(NON_REGULAR))
def test_non_regular_entry_is_a_miss_and_the_prefix_stops_there(
    tmp_path, identity, kind, probe, fifos
):
    """Chunks 0 and 2 are good files, chunk 1 is a non-regular entry (present before start, so
    both the start-up scan and the lookup probe meet it, on the engine's thread or a probe
    thread): lookup serves chunk 0 only."""
    root, keys = tmp_path / "cache", make_keys(identity, 3)
    seed_cache(root, identity, keys)
    target = chunk_path(root, identity, keys[1])
    outside = tmp_path / "outside" / keys[1].hex()
    outside.parent.mkdir()
    shutil.move(target, outside)
    NON_REGULAR[kind](target, outside)
    if kind == "fifo":
        fifos.append(target)
    manager = TieringManager(config(8, secondary_tiers=fs_tiers(root, probe=probe)), identity)
    try:
        assert settle(manager, keys) == 1
        (slot,) = manager.prepare_load(keys[:1])
        assert holds(manager.region, slot, keys[0])
        manager.complete_load(keys[:1])
        assert manager.tiers[0].wait_scanned(DEADLINE_S)  # the scan runs beside the lookup
        stats = disk_stats(manager)
        assert stats["scan_skipped.not_regular"] == 1
        assert stats.get("probe_failed.not_regular", 0) >= 1
    finally:
        close_unjammed(manager, fifos, "TieringManager.close()")
    assert outside.stat().st_size == file_bytes(identity)  # a link's target is never touched


@pytest.mark.parametrize("kind", ["fifo", "symlink out of the root"])
def test_a_store_replaces_a_non_regular_entry_and_never_touches_a_link_target(
    make_tier, tmp_path, identity, kind, fifos
):
    root, keys = tmp_path / "cache", make_keys(identity, 1)
    seed_cache(root, identity, keys)
    target = chunk_path(root, identity, keys[0])
    outside = tmp_path / "outside"
    outside.write_bytes(b"not a chunk, and not the tier's to change")
    target.unlink()
    NON_REGULAR[kind](target, outside)
    if kind == "fifo":
        fifos.append(target)
    tier, region = make_tier()
    fill(region, 0, keys[0])
    tier.submit_store(TransferJob(1, tuple(keys), (0,)))
    assert collect(tier, [1], timeout=DEADLINE_S)[1].ok
    assert stat.S_ISREG(target.lstat().st_mode)
    assert target.stat().st_size == file_bytes(identity)
    assert outside.read_bytes() == b"not a chunk, and not the tier's to change"
    tier.submit_load(TransferJob(2, tuple(keys), (1,)))
    assert collect(tier, [2], timeout=DEADLINE_S)[2].ok and holds(region, 1, keys[0])


def test_scan_never_follows_a_directory_link_out_of_the_root(tmp_path, identity):
    """A level directory that links to another cache is neither indexed nor evicted from:
    with max_bytes for two chunks, the restart evicts only this cache's own oldest files."""
    other, root = tmp_path / "other", tmp_path / "cache"
    theirs, mine = make_keys(identity, 1, seed=5), make_keys(identity, 5, seed=6)
    mine = [k for k in mine if k.hex()[:2] != theirs[0].hex()[:2]][:3]
    assert len(mine) == 3
    seed_cache(other, identity, theirs)
    seed_cache(root, identity, mine)
    level = theirs[0].hex()[:2]
    os.symlink(other / identity.hexdigest / level, root / identity.hexdigest / level)
    outside_file = chunk_path(other, identity, theirs[0])
    os.utime(outside_file, (1, 1))  # the oldest of all: the first victim if it were indexed
    tiers = fs_tiers(root, max_bytes=2 * file_bytes(identity))
    with TieringManager(config(8, secondary_tiers=tiers), identity) as manager:
        manager.tiers[0].wait_scanned(DEADLINE_S)  # type: ignore[attr-defined]
        assert outside_file.exists()
        stats = disk_stats(manager)
        assert stats["scan_skipped.not_regular"] == 1 and stats["index_chunks"] == 2
        assert settle(manager, theirs) == 0
        assert outside_file.exists()
    own_files = [f for _, _, files in os.walk(root / identity.hexdigest) for f in files]
    assert sorted(own_files) == sorted(["identity.json", *(k.hex() for k in mine[1:])])


# -- item 6: the start-up scan skips what it cannot read -------------------------------------
def test_symlink_loops_and_odd_entries_do_not_abort_the_scan(tmp_path, identity):
    """Loops at a chunk path and at a level directory, and a directory named like a stale
    temporary file, are skipped and counted; max_bytes still holds for the real chunks."""
    root, keys = tmp_path / "cache", make_keys(identity, 4)
    seed_cache(root, identity, keys)
    namespace = root / identity.hexdigest
    loop = chunk_path(root, identity, make_keys(identity, 1, seed=9)[0])
    loop.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(loop.name, loop)
    level_loop = next(
        namespace / f"{i:02x}" for i in range(256) if not (namespace / f"{i:02x}").exists()
    )
    os.symlink(level_loop.name, level_loop)
    stale_dir = chunk_path(root, identity, keys[0]).parent / f"{'ab' * 32}.{'0' * 8}-1-beef-1.tmp"
    stale_dir.mkdir()
    os.utime(stale_dir, (1, 1))
    tiers = fs_tiers(root, max_bytes=2 * file_bytes(identity))
    with TieringManager(config(8, secondary_tiers=tiers), identity) as manager:
        manager.tiers[0].wait_scanned(DEADLINE_S)  # type: ignore[attr-defined]
        stats = disk_stats(manager)
        assert not any(name.startswith("scan_failed") for name in stats), stats
        assert stats["scan_found_chunks"] == 4 and stats["index_chunks"] == 2
        assert stats["evicted"] == 2
        assert stats["scan_skipped.not_regular"] >= 1
        assert stats["scan_skipped.EISDIR"] == 1
        assert settle(manager, keys[2:]) == 2
    assert {chunk_path(root, identity, k).exists() for k in keys[:2]} == {False}


def modes_enforced() -> bool:
    """Whether a directory of mode 000 cannot be listed here (root usually lists it anyway)."""
    with tempfile.TemporaryDirectory() as scratch:
        closed = Path(scratch) / "closed"
        closed.mkdir(mode=0o000)
        try:
            os.listdir(closed)
        except PermissionError:
            return True
        finally:
            closed.chmod(0o700)
    return False


@pytest.mark.skipif(not modes_enforced(), reason="file modes are not enforced for this user")
def test_unreadable_directories_are_skipped_and_counted(tmp_path, identity):
    """A level directory of mode 000 (cannot be listed) and one of mode 0444 (its entries
    cannot be stat'ed) are skipped; max_bytes still holds for the chunks the scan can see."""
    root, keys = tmp_path / "cache", make_keys(identity, 12)
    seed_cache(root, identity, keys)
    by_level: dict[Path, list[ChunkKey]] = {}
    for key in keys:
        by_level.setdefault(chunk_path(root, identity, key).parent, []).append(key)
    closed, listable = list(by_level)[:2]
    visible = [k for level, ks in by_level.items() if level not in (closed, listable) for k in ks]
    closed.chmod(0o000)
    listable.chmod(0o444)
    try:
        tiers = fs_tiers(root, max_bytes=2 * file_bytes(identity))
        with TieringManager(config(8, secondary_tiers=tiers), identity) as manager:
            manager.tiers[0].wait_scanned(DEADLINE_S)  # type: ignore[attr-defined]
            stats = disk_stats(manager)
            assert stats["scan_skipped.EACCES"] == 1 + len(by_level[listable])
            assert stats["scan_found_chunks"] == len(visible) and stats["index_chunks"] == 2
        on_disk = [k for k in visible if chunk_path(root, identity, k).exists()]
        assert len(on_disk) == 2
    finally:
        closed.chmod(0o755)
        listable.chmod(0o755)


# -- item 6: a restart on a full disk starts read-only ---------------------------------------
@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill_up(directory: Path) -> Path:
    """Write a file until the filesystem has no byte left; returns it."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 512)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def assert_serves_and_refuses_stores(
    manager: TieringManager, stored: list[ChunkKey], new: list[ChunkKey]
) -> None:
    assert settle(manager, stored) == len(stored)
    slots = manager.prepare_load(stored)
    assert all(holds(manager.region, s, k) for s, k in zip(slots, stored, strict=True))
    manager.complete_load(stored)
    store_through(manager, new)
    stats = disk_stats(manager)
    assert stats["read_only"] == 1
    assert stats["store_failed.read_only"] == 1


def test_restart_on_a_full_disk_starts_read_only(small_tmpfs, identity, caplog, monkeypatch):
    """On a full 256 KiB tmpfs a restart serves what is there, fails stores (counted, with one
    warning), and writes again once there is room."""
    stored, new = make_keys(identity, 4, seed=1), make_keys(identity, 2, seed=2)
    seed_cache(small_tmpfs, identity, stored)
    filler = fill_up(small_tmpfs)
    tiers = fs_tiers(small_tmpfs)
    with caplog.at_level(logging.WARNING):
        manager = TieringManager(config(8, secondary_tiers=tiers), identity)
    warnings = [r for r in caplog.records if "read-only" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    with manager:
        assert_serves_and_refuses_stores(manager, stored, new[:1])
        from kvtier.tiers.fs import namespace as fs_namespace

        filler.unlink()
        monkeypatch.setattr(fs_namespace, "READ_ONLY_RETRY_S", 0.0)
        store_through(manager, new[1:])
        assert disk_stats(manager)["read_only"] == 0
        assert chunk_path(small_tmpfs, identity, new[1]).exists()


def test_full_disk_at_start_by_fault_injection(tmp_path, identity, monkeypatch):
    """The same where no tmpfs can be mounted: ENOSPC injected where the tier writes at start
    (its identity description). Fault injection at the OS boundary, for this case only."""
    from kvtier.tiers.fs import namespace as fs_namespace

    real_write = fs_namespace.write_description

    def disk_full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    root, stored, new = tmp_path / "cache", make_keys(identity, 2, seed=1), make_keys(identity, 1)
    seed_cache(root, identity, stored)
    monkeypatch.setattr(fs_namespace, "write_description", disk_full)
    with TieringManager(config(8, secondary_tiers=fs_tiers(root)), identity) as manager:
        assert_serves_and_refuses_stores(manager, stored, new)
        assert not chunk_path(root, identity, new[0]).exists()
        monkeypatch.setattr(fs_namespace, "write_description", real_write)
        monkeypatch.setattr(fs_namespace, "READ_ONLY_RETRY_S", 0.0)
        store_through(manager, make_keys(identity, 1, seed=3))
        assert disk_stats(manager)["read_only"] == 0


# -- a file of the wrong size at a chunk's path ----------------------------------------------
@pytest.mark.parametrize("planted", [1 << 40, 1, -1], ids=["1TiB-sparse", "a-byte-long", "short"])
def test_a_planted_file_of_the_wrong_size_evicts_nothing_and_is_deleted_at_its_load(
    tmp_path, identity, planted
):
    """The probe and the start-up scan indexed a file's st_size as found: one sparse 1 TiB file
    at a chunk's path made the bound evict (delete) every good chunk of the tier. Counted at a
    chunk's size, it fails its load (a miss), is deleted, and evicts nothing."""
    root, size = tmp_path / "fs", file_bytes(identity)
    size = planted if planted == 1 << 40 else size + planted
    good, evil = make_keys(identity, 6), make_keys(identity, 1, seed=99)
    tiers = fs_tiers(root, max_bytes=8 * file_bytes(identity))
    path = chunk_path(root, identity, evil[0])

    def plant() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as planted_file:
            planted_file.truncate(size)

    with TieringManager(config(4, secondary_tiers=tiers), identity) as manager:
        store_through(manager, good[:3])
        store_through(manager, good[3:])
        plant()
        assert settle(manager, evil) == 0
        stats = disk_stats(manager)
        assert stats["probe_wrong_size"] == 1 and stats.get("evicted", 0) == 0
        assert sum(v for k, v in stats.items() if k.startswith("integrity.")) == 1
        assert not path.exists()
    assert all(chunk_path(root, identity, key).exists() for key in good)
    plant()
    with TieringManager(config(4, secondary_tiers=tiers), identity) as manager:  # the scan
        assert manager.tiers[0].wait_scanned(DEADLINE_S)
        stats = disk_stats(manager)
        assert stats["scan_found_chunks"] == 7 and stats["scan_wrong_size"] == 1
        assert stats.get("evicted", 0) == 0
        assert settle(manager, good[:3]) == 3 and settle(manager, evil) == 0
        assert not path.exists()
    assert all(chunk_path(root, identity, key).exists() for key in good)
