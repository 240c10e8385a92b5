"""In-memory bookkeeping of the filesystem tier beside its ``ChunkIndex`` (which chunks are on
disk, in eviction order: ``tiers.shared.chunk_index``) and its ``RecentMisses``
(``tiers.shared.misses``).

``remembered_chunks`` is how many entries the index keeps when no ``max_bytes`` bounds it.

``UseStamps`` says when a chunk's last use was last written to its file (its mtime), so that a
chunk read again and again costs one ``utime`` a minute, not one per read.

No I/O. Thread safety: every method takes the instance's lock.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from kvtier.keys import ChunkKey
from kvtier.tiers.fs.config import FsTierConfig

#: The most chunks the index remembers without ``max_bytes`` or ``root_dir_max_bytes`` (about
#: 0.5 KB each); a chunk forgotten is found again by a probe.
MAX_INDEX_CHUNKS = 1 << 20
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


def remembered_chunks(config: FsTierConfig, file_bytes: int) -> int:
    """How many chunks the index remembers without ``max_bytes``: no more than the directory
    can hold under ``root_dir_max_bytes``, else ``MAX_INDEX_CHUNKS``. Other instances,
    ``kvtier cache gc`` and operators delete files; their entries here are dropped only when
    looked up, so without a bound they would pile up for as long as the server runs."""
    if config.root_dir_max_bytes is not None:
        return max(1, config.root_dir_max_bytes // file_bytes)
    return MAX_INDEX_CHUNKS
