"""When the filesystem tier goes through the page cache (``o_direct: "auto"``).

The page cache makes a reload of a chunk stored moments ago a memory copy (hot reloads ran at
3.6-4.1x vLLM's O_DIRECT tier at 2-8 MiB), but every page it holds for the tier is a page some
other file, or the engine, may want more. With "auto" (and a filesystem that allows O_DIRECT):

* **writes** go through the page cache while the machine has memory nobody uses: ``MemFree``
  (not ``MemAvailable``, which counts the cache itself) stays above ``reserve_fraction`` of
  ``MemTotal`` after the write. Then the cached chunk takes free memory and evicts nothing.
  Below that, writes use O_DIRECT and leave the cache to what is already there;
* **reads** ask the kernel how much of the file is cached (``cachestat``, Linux 6.5+: one
  syscall that starts no I/O). A wholly cached chunk is read through the cache (a memory
  copy); any other is read with O_DIRECT (the descriptor switched with ``fcntl``), so a cold
  read neither pollutes the cache nor pays for readahead. (``preadv2`` with ``RWF_NOWAIT`` was
  tried first and measured worse: a miss starts readahead, which the O_DIRECT read then waits
  behind; cold loads fell to 0.3x vLLM.)

Without ``cachestat`` (older kernels, seccomp) "auto" is plain O_DIRECT for reads and writes,
as before: caching writes nobody can find cheaply would only evict other pages.

``/proc/meminfo`` is read at most every ``interval_s`` seconds. Where it cannot be read, writes
use O_DIRECT (the safe side). Thread safety: ``write_buffered`` takes ``_lock``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import threading
import time

from kvtier.tiers.fs.paths import load_syscall

#: Writes use the page cache while MemFree stays above this fraction of MemTotal.
RESERVE_FRACTION = 0.25
MEMINFO = "/proc/meminfo"


_SYS_CACHESTAT = 451  # the same number on every Linux architecture
PAGE = 4096


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")
    ]


class CacheStat:
    """``cachestat(2)``: how many pages of an open file are in the page cache.

    ``available`` is false where the kernel lacks it (checked once, on a probe descriptor).
    Thread safety: any thread.
    """

    def __init__(self) -> None:
        self._syscall = load_syscall(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)
        self.available = self._syscall is not None and self._probe()

    def _probe(self) -> bool:
        try:
            fd = os.open(sys.executable, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            return self.cached_pages(fd) is not None
        finally:
            os.close(fd)

    def cached_pages(self, fd: int) -> int | None:
        """Pages of ``fd`` in the page cache; ``None`` when it cannot say."""
        if self._syscall is None:
            return None
        whole, result = _Range(0, 0), _Stat()
        if self._syscall(_SYS_CACHESTAT, fd, ctypes.byref(whole), ctypes.byref(result), 0) < 0:
            code = ctypes.get_errno()
            return None if code in (errno.ENOSYS, errno.EPERM, errno.EBADF) else 0
        return int(result.nr_cache)

    def is_cached(self, fd: int, size: int) -> bool:
        """Whether every page of the ``size``-byte file ``fd`` is cached."""
        pages = self.cached_pages(fd)
        return pages is not None and pages * PAGE >= size


#: The process's ``cachestat`` (whether the kernel has it is the same for everyone).
CACHESTAT = CacheStat()


def read_meminfo(path: str = MEMINFO) -> tuple[int, int] | None:
    """(MemTotal, MemFree) in bytes, or ``None`` when they cannot be read."""
    try:
        with open(path, "rb") as file:
            text = file.read(4096)
    except OSError:
        return None
    fields: dict[bytes, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(b":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name] = int(parts[0]) * 1024
    if b"MemTotal" not in fields or b"MemFree" not in fields:
        return None
    return fields[b"MemTotal"], fields[b"MemFree"]


class PageCacheBudget:
    """Whether a write of ``nbytes`` may go through the page cache; see the module docstring."""

    def __init__(
        self,
        reserve_fraction: float = RESERVE_FRACTION,
        interval_s: float = 1.0,
        meminfo: str = MEMINFO,
    ) -> None:
        self._reserve_fraction = reserve_fraction
        self._interval_s = interval_s
        self._meminfo = meminfo
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._room = 0  # bytes that may still be written through the cache

    def write_buffered(self, nbytes: int) -> bool:
        with self._lock:
            now = time.monotonic()
            if now >= self._next_check:
                self._next_check = now + self._interval_s
                self._room = self._measure()
            if self._room < nbytes:
                return False
            self._room -= nbytes
            return True

    def _measure(self) -> int:
        info = read_meminfo(self._meminfo)
        if info is None:
            return 0
        total, free = info
        return max(0, free - int(total * self._reserve_fraction))
