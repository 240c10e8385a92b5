"""IoStats: what SGLang's ``get_stats`` reports, gathered between two calls.

SGLang's ``StorageMetrics`` (with ``--enable-metrics``) holds, since the last call, the pages
of each prefetch (load) and backup (store) and their bandwidth in GB/s; SGLang turns them into
its ``sglang:...storage...`` metrics. kvtier's own counters (``/metrics``) are the runtime's.
Without ``--enable-metrics`` SGLang never calls ``get_stats``, so only the last ``MAX_SAMPLES``
calls of each kind are kept: a server that runs for months holds no more.

Thread safety: ``record`` runs on SGLang's load and backup threads, ``take`` on its scheduler
thread; both take the lock.
"""

from __future__ import annotations

import threading
from collections import deque

#: Calls of each kind (load, store) remembered between two ``take``s, the oldest dropped first.
MAX_SAMPLES = 4096
_FIELDS = {
    "load": ("prefetch_pgs", "prefetch_bandwidth"),
    "store": ("backup_pgs", "backup_bandwidth"),
}


class IoStats:
    """Pages and GB/s per load and store call since the last ``take`` (the last
    ``max_samples`` of each kind)."""

    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        self._lock = threading.Lock()
        self._max = max_samples
        self._lists: dict[str, deque[float]] = self._empty()

    def _empty(self) -> dict[str, deque[float]]:
        return {name: deque(maxlen=self._max) for pair in _FIELDS.values() for name in pair}

    def record(self, op: str, pages: int, nbytes: int, seconds: float) -> None:
        """One ``load`` or ``store`` call that moved ``pages`` (``nbytes``) in ``seconds``."""
        pages_field, bandwidth_field = _FIELDS[op]
        with self._lock:
            self._lists[pages_field].append(pages)
            self._lists[bandwidth_field].append(nbytes / max(seconds, 1e-9) / 1e9)

    def take(self) -> dict[str, list[float]]:
        """The lists since the last call (SGLang's ``StorageMetrics`` fields), emptied."""
        with self._lock:
            lists, self._lists = self._lists, self._empty()
        return {name: list(values) for name, values in lists.items()}
