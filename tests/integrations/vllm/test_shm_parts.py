"""The vLLM-free host-memory hygiene of kvtier's specs (``kvtier.integrations.vllm.shm``).

Real files in ``/dev/shm`` (tmpfs, where vLLM keeps its host regions), in a directory of this
test's own: engines on this machine sweep ``/dev/shm`` itself, never a directory below it. An
"owner" is a child process that claims a region the way a worker does and then lives or is
killed; a lock the kernel dropped at its death is what lets a sweep remove the region.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.integrations.vllm import shm
from tests.child_process import child_env
from tests.conftest import read_line

PAGE = mmap.PAGESIZE

#: A child that sweeps DIR first if asked, then claims each REGION (marker and lock, as a
#: worker does), reports what it removed into its marker, creates the region with SIZE bytes,
#: and lives until killed.
OWNER = """
import sys, time
from kvtier.integrations.vllm import shm
sweep_dir, size, regions = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
removed = shm.sweep(sweep_dir) if sweep_dir else []
claims = [shm.Claim.acquire(region) for region in regions]
for claim, region in zip(claims, regions):
    claim.report(removed)
    with open(region, "ab") as f:
        f.truncate(size)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kvtier-test-shm-", dir=shm.SHM_DIR))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def owners() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def region(directory: Path, name: str) -> Path:
    return Path(shm.region_path(name, str(directory)))


def marker(path: Path) -> Path:
    return Path(shm.marker_path(str(path)))


def start_owner(
    procs: list[subprocess.Popen[bytes]],
    paths: list[Path],
    size: int,
    sweep_dir: Path | None = None,
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", OWNER, str(sweep_dir or ""), str(size), *map(str, paths)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, env=child_env())
    procs.append(proc)
    assert read_line(proc, 30, "owner start") == b"ready"
    return proc


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def dead_regions(
    procs: list[subprocess.Popen[bytes]], directory: Path, names: list[str], size: int = 3 * PAGE
) -> list[Path]:
    """Regions (and markers) whose only owner was SIGKILLed, as a killed engine leaves them."""
    paths = [region(directory, name) for name in names]
    kill(start_owner(procs, paths, size))
    assert all(path.exists() and marker(path).exists() for path in paths)
    return paths


def dead_region(
    procs: list[subprocess.Popen[bytes]], directory: Path, name: str, size: int = 3 * PAGE
) -> Path:
    (path,) = dead_regions(procs, directory, [name], size)
    return path


def test_region_paths_are_vllms():
    assert shm.region_path("e-1") == "/dev/shm/vllm_offload_e-1.mmap"
    assert shm.marker_path(shm.region_path("e-1")) == "/dev/shm/vllm_offload_e-1.mmap.kvtier-lock"


def test_a_sweep_removes_the_region_of_a_killed_owner_logs_and_counts_it(shm_dir, owners, caplog):
    path = dead_region(owners, shm_dir, "dead", size=5 * PAGE)
    regions, size = shm.regions_removed(), shm.bytes_removed()
    with caplog.at_level(logging.WARNING, logger=shm.__name__):
        removed = shm.sweep(str(shm_dir))
    assert removed == [shm.Removal(str(path), 5 * PAGE)]
    assert not path.exists() and not marker(path).exists()
    assert (shm.regions_removed(), shm.bytes_removed()) == (regions + 1, size + 5 * PAGE)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert str(path) in record.getMessage() and f"{5 * PAGE} bytes" in record.getMessage()


def test_a_sweep_keeps_a_region_while_any_of_its_openers_lives(shm_dir, owners):
    path = region(shm_dir, "live")
    owner = start_owner(owners, [path], 2 * PAGE)
    assert shm.sweep(str(shm_dir)) == []
    joiner = shm.Claim.acquire(str(path))  # a second opener, as the scheduler is
    kill(owner)
    assert shm.sweep(str(shm_dir)) == []
    assert path.exists() and marker(path).exists()
    joiner.release()  # the region is still named: the marker stays with it
    assert marker(path).exists()
    assert shm.sweep(str(shm_dir)) == [shm.Removal(str(path), 2 * PAGE)]


def test_a_sweep_never_touches_a_region_kvtier_did_not_mark(shm_dir, owners):
    stock = region(shm_dir, "stock")  # vLLM's own spec: a region, no marker
    stock.write_bytes(b"\0" * PAGE)
    elsewhere = dead_region(owners, shm_dir, "x")  # a prefix the sweep is not asked about
    assert shm.sweep(str(shm_dir), prefix="vllm_offload_s") == []
    assert stock.exists() and elsewhere.exists() and marker(elsewhere).exists()


def test_a_marker_left_without_its_region_goes_uncounted_and_unlogged(shm_dir, owners, caplog):
    path = dead_region(owners, shm_dir, "half")
    path.unlink()
    regions = shm.regions_removed()
    with caplog.at_level(logging.WARNING, logger=shm.__name__):
        assert shm.sweep(str(shm_dir)) == []
    assert not marker(path).exists()
    assert shm.regions_removed() == regions and not caplog.records


def test_a_claim_waits_for_a_sweeper_and_retries_when_its_marker_was_removed(shm_dir, monkeypatch):
    path = region(shm_dir, "race")
    sweeper = os.open(shm.marker_path(str(path)), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(sweeper, fcntl.LOCK_EX)
    with pytest.raises(TimeoutError):
        shm.Claim.acquire(str(path), timeout_s=0.2)
    os.close(sweeper)
    # A sweeper that removes the marker between the claim's open and its lock: the claim
    # must not keep a lock on a file no longer at the marker's path.
    real, calls = shm._lock_shared, []

    def lock_after_a_sweep(fd: int) -> bool:
        if not calls:
            os.unlink(shm.marker_path(str(path)))
        calls.append(fd)
        return real(fd)

    monkeypatch.setattr(shm, "_lock_shared", lock_after_a_sweep)
    claim = shm.Claim.acquire(str(path))
    assert len(calls) == 2 and marker(path).exists()
    path.write_bytes(b"\0" * PAGE)
    assert shm.sweep(str(shm_dir)) == []  # the lock is on the marker at the path
    claim.release()


def test_forget_name_unlinks_the_file_in_use_only_and_its_memory_stays_shared(shm_dir):
    path = region(shm_dir, "named")
    path.write_bytes(b"\0" * 2 * PAGE)
    claim = shm.Claim.acquire(str(path))
    fd_a, fd_b = os.open(path, os.O_RDWR), os.open(path, os.O_RDWR)
    try:
        map_a, map_b = mmap.mmap(fd_a, 2 * PAGE), mmap.mmap(fd_b, 2 * PAGE)
        assert claim.forget_name(fd_a)
        assert not path.exists() and not marker(path).exists()
        map_a[PAGE : PAGE + 5] = b"kvkv!"
        assert map_b[PAGE : PAGE + 5] == b"kvkv!"  # one region, two mappings, no name
        path.write_bytes(b"new")  # another file under the name now
        assert not claim.forget_name(fd_a) and path.read_bytes() == b"new"
        map_a.close()
        map_b.close()
    finally:
        os.close(fd_a)
        os.close(fd_b)
        claim.release()


def test_release_removes_the_marker_only_as_the_last_opener_of_a_gone_region(shm_dir):
    path = region(shm_dir, "last")
    path.write_bytes(b"\0" * PAGE)
    first, second = shm.Claim.acquire(str(path)), shm.Claim.acquire(str(path))
    first.release()
    assert marker(path).exists()  # the region is still named
    path.unlink()
    third = shm.Claim.acquire(str(path))
    second.release()
    assert marker(path).exists()  # another opener still holds it
    third.release()
    assert not marker(path).exists()
    third.release()  # idempotent


def test_removals_reported_by_workers_are_counted_where_the_marker_is_read(shm_dir, owners):
    dead = dead_region(owners, shm_dir, "dead", size=4 * PAGE)
    own = region(shm_dir, "engine")
    start_owner(owners, [own], PAGE, sweep_dir=shm_dir)  # the worker: sweeps, then claims
    assert not dead.exists()
    scheduler = shm.Claim.acquire(str(own))
    scheduler.report([shm.Removal("/dev/shm/counted-here-already", 1)])
    with open(marker(own), "a") as f:
        f.write("not a report\n")
    regions, size = shm.regions_removed(), shm.bytes_removed()
    assert scheduler.take_reports() == [shm.Removal(str(dead), 4 * PAGE)]
    assert (shm.regions_removed(), shm.bytes_removed()) == (regions + 1, size + 4 * PAGE)
    scheduler.release()


def test_concurrent_sweeps_remove_each_dead_region_once(shm_dir, owners):
    paths = dead_regions(owners, shm_dir, [f"d{i}" for i in range(8)])
    results: list[list[shm.Removal]] = [[] for _ in range(4)]

    def run(i: int) -> None:
        results[i] = shm.sweep(str(shm_dir))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    removed = sorted(r.path for result in results for r in result)
    assert removed == sorted(map(str, paths))
    assert not any(p.exists() or marker(p).exists() for p in paths)
