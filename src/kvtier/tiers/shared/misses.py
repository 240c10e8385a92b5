"""RecentMisses: keys a tier found absent, remembered for a while so lookups answer at once.

A miss is remembered for ``ttl_s`` seconds (then the medium is asked again: another instance
may have stored the chunk meanwhile) and, whatever ``ttl_s``, until a lookup has been told
once. A lookup that answered ``RETRY`` while a probe ran must get the probe's answer: with a
ttl of 0 it would otherwise start another probe, and the engine would wait on a key that never
settles.

No I/O. Thread safety: every method takes the instance's lock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from kvtier.keys import ChunkKey

#: How many misses are remembered at most (oldest forgotten first).
MAX_RECENT_MISSES = 1 << 16


class RecentMisses:
    """Keys found absent, each forgotten ``ttl_s`` seconds after it was added, once asked."""

    def __init__(self, ttl_s: float, capacity: int = MAX_RECENT_MISSES) -> None:
        self._ttl_s = ttl_s
        self._capacity = capacity
        self._expiry: OrderedDict[ChunkKey, float] = OrderedDict()
        self._unasked: set[ChunkKey] = set()
        self._lock = threading.Lock()

    def add(self, key: ChunkKey) -> None:
        with self._lock:
            self._expiry[key] = time.monotonic() + self._ttl_s
            self._expiry.move_to_end(key)
            self._unasked.add(key)
            while len(self._expiry) > self._capacity:
                oldest, _ = self._expiry.popitem(last=False)
                self._unasked.discard(oldest)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            expiry = self._expiry.get(key)  # type: ignore[call-overload]
            if expiry is None:
                return False
            if key in self._unasked:
                self._unasked.discard(key)
                return True
            if expiry > time.monotonic():
                return True
            del self._expiry[key]  # type: ignore[arg-type]
            return False

    def discard(self, key: ChunkKey) -> None:
        with self._lock:
            self._expiry.pop(key, None)
            self._unasked.discard(key)

    def clear(self) -> None:
        with self._lock:
            self._expiry.clear()
            self._unasked.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._expiry)
