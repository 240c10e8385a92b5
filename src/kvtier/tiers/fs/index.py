"""In-memory bookkeeping of the filesystem tier beside its ``ChunkIndex`` (which chunks are on
disk, in eviction order: ``tiers.shared.chunk_index``) and its ``RecentMisses``
(``tiers.shared.misses``).

``UseStamps`` says when a chunk's last use was last written to its file (its mtime), so that a
chunk read again and again costs one ``utime`` a minute, not one per read.

No I/O. Thread safety: every method takes the instance's lock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from kvtier.keys import ChunkKey

#: How many chunks' use stamps are remembered at most (oldest forgotten first).
MAX_STAMPS = 1 << 16


class UseStamps:
    """Keys whose use was written to disk in the last ``interval_s`` seconds (bounded)."""

    def __init__(self, interval_s: float, capacity: int = MAX_STAMPS) -> None:
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
            self._note(key, now)
            return True

    def written(self, key: ChunkKey) -> None:
        """``key``'s file was just written (stored): its mtime is now, a use's stamp."""
        with self._lock:
            self._note(key, time.monotonic())

    def _note(self, key: ChunkKey, now: float) -> None:
        self._written[key] = now
        self._written.move_to_end(key)
        while len(self._written) > self._capacity:
            self._written.popitem(last=False)
