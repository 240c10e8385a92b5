"""Host-memory hygiene for kvtier's vLLM specs: no ``/dev/shm`` region outlives its engine.

vLLM's tiering spec keeps its host tier in ``/dev/shm/vllm_offload_<engine_id>.mmap``, a tmpfs
file the size of ``cpu_bytes_to_use``. Every worker rank opens it in ``get_worker`` (worker
process), then the scheduler opens it in ``get_manager`` (engine-core process): vLLM builds the
scheduler only after every worker has registered its KV caches. vLLM removes the name when the
worker that created it shuts down cleanly, but the OpenAI API server force-kills its engine
core on a stop (at once, by default), so the file and its memory stayed behind on every Ctrl-C
or SIGTERM.

Design, two measures:

1. **The name goes as soon as every opener has mapped the file** (``Claim.forget_name``). A
   tmpfs file's memory lives while a name or a mapping does, so from then on the kernel frees
   the region when the engine's last process exits, however it exits: Ctrl-C, SIGTERM, SIGKILL,
   OOM kill. The scheduler does it, as the last opener, and only when a worker created the file
   (the scheduler joined it). Unlinking any earlier (say, by the worker right after creating
   it) would make the scheduler create a second, separate region; a watchdog process would be
   one more process that can be killed, and nothing it does beats an unlinked name.
2. **Regions of dead engines are removed at start** (``sweep``): an engine killed between
   creating its region and its scheduler mapping it, or one whose start failed, still leaves
   a named file. A region is kvtier's only if it has a marker, ``<region>.kvtier-lock``, that
   kvtier made before the region; every opener holds a shared ``flock`` on the marker from
   before it opens the region until it exits. ``sweep`` removes a region only while holding
   the marker's lock exclusively: the kernel drops a process's locks when it dies, so getting
   that lock proves every opener is gone. A live engine's region (its openers hold the lock)
   and regions without a marker (vLLM's own specs, older kvtier versions, other programs) are
   never touched. Each removal is logged (WARNING, file and bytes) and counted. (A process
   forked by an opener inherits its lock: the region then counts as live until the child
   exits too. The error is always on the side of keeping memory, never of freeing it.)

Who runs what (each function runs in the caller's thread):

* worker process, the thread that registers the KV caches (``get_worker``): ``sweep()`` before
  its region is allocated (leftovers never crowd out the new region), ``Claim.acquire``,
  ``Claim.report`` (writes what it removed into the marker), then vLLM creates or opens the
  region; ``Claim.release`` at worker shutdown (or the kernel, at exit).
* engine-core process, scheduler thread (``get_manager``): ``Claim.acquire``,
  ``Claim.take_reports`` (counts the workers' removals in this process, where kvtier's tiers
  report metrics), vLLM opens the region, ``Claim.forget_name``, ``Claim.release``.
* ``regions_removed`` and ``bytes_removed``: any thread (this process's counts).

Nothing here imports vLLM.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from dataclasses import dataclass

SHM_DIR = "/dev/shm"
#: vLLM's name of an engine's host region: ``<dir>/vllm_offload_<engine_id>.mmap``.
REGION_PREFIX, REGION_SUFFIX = "vllm_offload_", ".mmap"
MARKER_SUFFIX = ".kvtier-lock"
#: How long ``Claim.acquire`` waits for a sweeper's exclusive lock (held for a few syscalls).
ACQUIRE_TIMEOUT_S = 30.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Removal:
    """A region of a dead engine that was removed: its path and its size in bytes."""

    path: str
    size: int


class _Tally:
    """Regions and bytes removed in or reported to this process; any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.regions = 0
        self.bytes = 0

    def add(self, removals: list[Removal]) -> None:
        with self._lock:
            self.regions += len(removals)
            self.bytes += sum(r.size for r in removals)


_tally = _Tally()


def regions_removed() -> int:
    """Regions of dead engines removed by this process, or by the workers that reported to it."""
    return _tally.regions


def bytes_removed() -> int:
    """Bytes of the regions counted by ``regions_removed``."""
    return _tally.bytes


def region_path(engine_id: str, directory: str = SHM_DIR) -> str:
    """vLLM's path of the host region of ``engine_id``."""
    return os.path.join(directory, f"{REGION_PREFIX}{engine_id}{REGION_SUFFIX}")


def marker_path(region: str) -> str:
    """The path of the marker kvtier keeps next to ``region``."""
    return region + MARKER_SUFFIX


def names_file(path: str, fd: int) -> bool:
    """Whether ``path`` is (still) a name of the file open as ``fd``."""
    try:
        named, opened = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def sweep(directory: str = SHM_DIR, prefix: str = REGION_PREFIX) -> list[Removal]:
    """Remove the regions (and markers) under ``directory`` whose openers are all dead.

    Only files named ``<prefix>*.mmap`` with a kvtier marker are considered. Each removal is
    logged (WARNING) and counted in ``regions_removed``. Never raises for a file it cannot open
    or lock (another user's, or one in use): it is skipped.
    """
    removed = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:  # no such directory (not Linux): nothing of ours there
        return []
    for name in names:
        if name.startswith(prefix) and name.endswith(REGION_SUFFIX + MARKER_SUFFIX):
            removal = _remove_if_abandoned(os.path.join(directory, name))
            if removal is not None:
                removed.append(removal)
    _tally.add(removed)
    return removed


def _remove_if_abandoned(marker: str) -> Removal | None:
    """Remove ``marker`` and its region if no process holds the marker's lock."""
    try:
        fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # gone meanwhile, or not ours to open
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # an opener is alive
        if not names_file(marker, fd):
            return None  # removed (and maybe made anew) by someone else meanwhile
        region = marker[: -len(MARKER_SUFFIX)]
        size = _unlink(region)
        _unlink(marker)  # after the region: a region is never left without its marker
    finally:
        os.close(fd)
    if size is None:
        return None  # a marker whose region had already gone: nothing to report
    log.warning(
        "kvtier: removed %s (%d bytes), the host-memory region of a vLLM engine that is gone",
        region,
        size,
    )
    return Removal(region, size)


def _unlink(path: str) -> int | None:
    """Unlink ``path``; its size, or None if it did not exist."""
    try:
        size = os.stat(path, follow_symlinks=False).st_size
        os.unlink(path)
    except FileNotFoundError:
        return None
    return size


class Claim:
    """One opener's shared lock on the marker of a region: the region is in use while held.

    Take it (``acquire``) before opening the region and keep it while the region is mapped;
    the kernel drops it when the process dies. Not thread-safe: one owner thread.
    """

    def __init__(self, region: str, fd: int) -> None:
        self.region = region
        self.marker = marker_path(region)
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, region: str, timeout_s: float = ACQUIRE_TIMEOUT_S) -> Claim:
        """Create (or open) the marker of ``region`` and hold its lock shared.

        Retries while a sweeper holds it exclusively, and when a sweeper removed the marker
        between our open and our lock; ``TimeoutError`` after ``timeout_s``.
        """
        marker, deadline = marker_path(region), time.monotonic() + timeout_s
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        while True:
            fd = os.open(marker, flags, 0o600)
            if _lock_shared(fd) and names_file(marker, fd):
                return cls(region, fd)
            os.close(fd)
            if time.monotonic() > deadline:
                raise TimeoutError(f"kvtier: could not lock {marker} in {timeout_s} s")
            time.sleep(0.01)

    def report(self, removals: list[Removal]) -> None:
        """Write ``removals`` (this process's sweep) into the marker for ``take_reports``."""
        lines = "".join(f"{os.getpid()} {r.size} {r.path}\n" for r in removals)
        if lines and self._fd is not None:
            os.write(self._fd, lines.encode())  # O_APPEND: one write, never interleaved

    def take_reports(self) -> list[Removal]:
        """The removals other processes reported into the marker; counted in this process."""
        if self._fd is None:
            return []
        text = os.pread(self._fd, os.fstat(self._fd).st_size, 0).decode(errors="replace")
        removals = [r for r in map(_parse_report, text.splitlines()) if r is not None]
        _tally.add(removals)
        return removals

    def forget_name(self, region_fd: int) -> bool:
        """Unlink the region's name, then the marker, if the name is the file open as
        ``region_fd``; call once every process that uses the region has mapped it.

        The mappings stay valid; the kernel frees the memory when the last one goes.
        """
        if not names_file(self.region, region_fd):
            return False
        _unlink(self.region)
        if self._fd is not None and names_file(self.marker, self._fd):
            _unlink(self.marker)
        return True

    def release(self) -> None:
        """Drop the lock; remove the marker too if the region's name is gone and no other
        opener holds it. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            gone = not os.path.lexists(self.region)
            if gone and _try_exclusive(fd) and names_file(self.marker, fd):
                _unlink(self.marker)
        finally:
            os.close(fd)


def _parse_report(line: str) -> Removal | None:
    """A line of ``Claim.report``; None for this process's own (counted already) or a bad one."""
    pid, _, rest = line.partition(" ")
    size, _, path = rest.partition(" ")
    if not (pid.isdigit() and size.isdigit() and path) or int(pid) == os.getpid():
        return None
    return Removal(path, int(size))


def _lock_shared(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _try_exclusive(fd: int) -> bool:
    """Turn a held shared lock exclusive if no one else holds it (on failure the shared lock
    may be lost: call it only right before closing ``fd``)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            return False
        raise
    return True
