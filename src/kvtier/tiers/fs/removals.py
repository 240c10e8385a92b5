"""Removals: the fs tier's deletions of chunk files, and the keys they took away.

Every path by which a chunk leaves the tier (evicted under ``max_bytes``, evicted from the
shared ``root_dir_max_bytes``, deleted as corrupt) goes through here, so the index, the shared
bound and ``take_removed`` (KV events, the manager's forgetting) always agree.

Thread safety: called from the tier's job, probe and scan threads and the manager's thread;
``ChunkIndex``, ``Counters`` and the shared bound lock themselves, and a bounded ``deque``'s
``append``/``popleft`` are atomic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from kvtier.keys import ChunkKey
from kvtier.tiers.fs.files import ChunkFiles
from kvtier.tiers.fs.paths import failure_reason
from kvtier.tiers.fs.shared_bound import SharedBound
from kvtier.tiers.shared.chunk_index import ChunkIndex
from kvtier.tiers.shared.counters import Counters

#: How many removed keys ``take`` remembers at most.
MAX_REMOVED = 1 << 16


class Removals:
    """Deletes chunk files of ``file_bytes`` and remembers their keys for ``take``."""

    def __init__(
        self,
        files: ChunkFiles,
        index: ChunkIndex,
        shared: SharedBound | None,
        counters: Counters,
        file_bytes: int,
    ) -> None:
        self._files, self._index, self._shared = files, index, shared
        self._counters, self._file_bytes = counters, file_bytes
        self._removed: deque[ChunkKey] = deque(maxlen=MAX_REMOVED)

    def delete(self, keys: Iterable[ChunkKey], reason: str) -> None:
        """Delete each key's file (a failure is counted, the key is gone from the index all
        the same) and count each under ``reason``."""
        for key in keys:
            try:
                if self._files.remove(key) and self._shared is not None:
                    self._shared.release(self._file_bytes)
            except OSError as exc:
                self._counters.add(f"remove_failed.{failure_reason(exc)}")
            self._index.deleted(key)  # a probe that stat'ed it before the unlink is a miss
            self._removed.append(key)
            self._counters.add(reason)

    def reserve_shared(self, nbytes: int, key: ChunkKey) -> bool:
        """Room under ``root_dir_max_bytes`` (when set); own chunks it deleted are forgotten."""
        if self._shared is None:
            return True
        own = self._shared.reserve(nbytes, key)
        if own is None:
            return False
        for gone in own:
            self._index.discard(gone)
            self._removed.append(gone)
            self._counters.add("evicted_shared")
        return True

    def deleted_elsewhere(self, key: ChunkKey) -> None:
        """Note a key whose file the reader deleted (it failed verification)."""
        self._removed.append(key)

    def take(self) -> list[ChunkKey]:
        """Keys removed since the last call, oldest first."""
        return [self._removed.popleft() for _ in range(len(self._removed))]
