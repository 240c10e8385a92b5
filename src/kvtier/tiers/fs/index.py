"""In-memory bookkeeping of the filesystem tier: which chunks are on disk, and recent misses.

``ChunkIndex`` holds the chunk files this instance knows of (written, found by a probe, or found
by the start-up scan) in least-recently-used order, with their sizes, and keeps their total
under ``max_bytes`` by naming victims. ``RecentMisses`` remembers keys found absent for a short
time, so lookups answer at once yet chunks written later by another instance become visible.

Neither class does I/O: callers delete the victims' files. Thread safety: every method of both
classes takes the instance's lock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable

from kvtier.errors import CapacityError
from kvtier.keys import ChunkKey

#: How many recent misses are remembered at most (oldest forgotten first).
MAX_RECENT_MISSES = 1 << 16


class ChunkIndex:
    """Key → file size in LRU order (coldest first), bounded by ``max_bytes`` when given.

    ``used_bytes`` counts indexed files plus *reservations*: bytes of writes in flight, taken by
    ``reserve`` before a write and turned into an entry by ``commit`` (or returned by
    ``release``), so that files on disk never exceed the bound, even while being written.
    """

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self._sizes: OrderedDict[ChunkKey, int] = OrderedDict()
        self._indexed = 0  # bytes of the files in _sizes
        self._reserved = 0  # bytes of writes in flight
        self._lock = threading.Lock()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._sizes

    def __len__(self) -> int:
        with self._lock:
            return len(self._sizes)

    @property
    def used_bytes(self) -> int:
        """Bytes of indexed files plus reservations of writes in flight."""
        with self._lock:
            return self._indexed + self._reserved

    def touch(self, key: ChunkKey) -> bool:
        """Mark ``key`` most recently used; ``False`` if it is not indexed."""
        with self._lock:
            if key not in self._sizes:
                return False
            self._sizes.move_to_end(key)
            return True

    def reserve(self, nbytes: int) -> list[ChunkKey]:
        """Reserve room for a write of ``nbytes``; returns the keys evicted to make it.

        Raises ``CapacityError`` (reserving nothing) when writes in flight alone fill the bound.
        """
        with self._lock:
            victims = self._evict_for(nbytes)
            if victims is None:
                raise CapacityError(f"max_bytes={self.max_bytes} is taken by writes in flight")
            self._reserved += nbytes
            return victims

    def release(self, nbytes: int) -> None:
        """Give back a reservation whose write failed."""
        with self._lock:
            self._reserved -= nbytes

    def commit(self, key: ChunkKey, nbytes: int) -> None:
        """A reserved write of ``key`` landed: the reservation becomes its entry (MRU)."""
        with self._lock:
            self._reserved -= nbytes
            self._indexed += nbytes - self._sizes.pop(key, 0)  # a key written twice is replaced
            self._sizes[key] = nbytes

    def add(self, key: ChunkKey, nbytes: int) -> list[ChunkKey]:
        """A file found on disk (MRU); returns the keys evicted to stay under the bound."""
        with self._lock:
            if key in self._sizes:
                self._sizes.move_to_end(key)
                return []
            self._sizes[key] = nbytes
            self._indexed += nbytes
            return self._evict_for(0) or []

    def merge_cold(self, found: Iterable[tuple[ChunkKey, int]]) -> list[ChunkKey]:
        """Add files found by a scan, given oldest first, below every known key.

        Keys already indexed keep their place. Returns the keys evicted to stay under the bound.
        """
        with self._lock:
            for key, nbytes in reversed(list(found)):
                if key not in self._sizes:
                    self._sizes[key] = nbytes
                    self._sizes.move_to_end(key, last=False)
                    self._indexed += nbytes
            return self._evict_for(0) or []

    def discard(self, key: ChunkKey) -> bool:
        """Forget ``key`` (its file is gone or bad); ``False`` if it was not indexed."""
        with self._lock:
            nbytes = self._sizes.pop(key, None)
            if nbytes is None:
                return False
            self._indexed -= nbytes
            return True

    def _evict_for(self, nbytes: int) -> list[ChunkKey] | None:
        """Pop LRU entries until ``nbytes`` more fit; ``None`` (nothing popped) if they cannot."""
        if self.max_bytes is None:
            return []
        excess = self._indexed + self._reserved + nbytes - self.max_bytes
        if excess > self._indexed:
            return None
        victims = []
        while excess > 0:
            key, size = self._sizes.popitem(last=False)
            self._indexed -= size
            excess -= size
            victims.append(key)
        return victims


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
