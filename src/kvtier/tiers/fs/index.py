"""In-memory bookkeeping of the filesystem tier beside its ``ChunkIndex`` (which chunks are on
disk, in eviction order: ``tiers.shared.chunk_index``).

``RecentMisses`` remembers keys found absent for a short time, so lookups answer at once yet
chunks written later by another instance become visible. ``UseStamps`` says when a chunk's
last use was last written to its file (its mtime), so that a chunk read again and again costs
one ``utime`` a minute, not one per read.

Neither class does I/O. Thread safety: every method of both classes takes the instance's lock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from kvtier.keys import ChunkKey

#: How many recent misses are remembered at most (oldest forgotten first).
MAX_RECENT_MISSES = 1 << 16


class RecentMisses:
    """Keys found absent, each forgotten ``ttl_s`` seconds after it was added."""

    def __init__(self, ttl_s: float, capacity: int = MAX_RECENT_MISSES) -> None:
        self._ttl_s = ttl_s
        self._capacity = capacity
        self._expiry: OrderedDict[ChunkKey, float] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, key: ChunkKey) -> None:
        with self._lock:
            self._expiry[key] = time.monotonic() + self._ttl_s
            self._expiry.move_to_end(key)
            while len(self._expiry) > self._capacity:
                self._expiry.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            expiry = self._expiry.get(key)  # type: ignore[call-overload]
            if expiry is None:
                return False
            if expiry > time.monotonic():
                return True
            del self._expiry[key]  # type: ignore[arg-type]
            return False

    def discard(self, key: ChunkKey) -> None:
        with self._lock:
            self._expiry.pop(key, None)


class UseStamps:
    """Keys whose use was written to disk in the last ``interval_s`` seconds (bounded)."""

    def __init__(self, interval_s: float, capacity: int = MAX_RECENT_MISSES) -> None:
        self._interval_s = interval_s
        self._capacity = capacity
        self._written: OrderedDict[ChunkKey, float] = OrderedDict()
        self._lock = threading.Lock()

    def due(self, key: ChunkKey) -> bool:
        """Whether ``key``'s use should be written now; if so it counts as written."""
        now = time.monotonic()
        with self._lock:
            last = self._written.get(key)
            if last is not None and now - last < self._interval_s:
                return False
            self._written[key] = now
            self._written.move_to_end(key)
            while len(self._written) > self._capacity:
                self._written.popitem(last=False)
            return True
