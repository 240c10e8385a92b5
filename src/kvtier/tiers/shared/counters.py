"""Counters: thread-safe named counts, what a tier's ``stats()`` reports."""

from __future__ import annotations

import threading
from collections import Counter


class Counters:
    """Thread-safe named counters."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def add_pair(self, first: str, second: str, n: int) -> None:
        """``first`` += 1 and ``second`` += ``n`` under one lock (a chunk and its bytes)."""
        with self._lock:
            self._counts[first] += 1
            self._counts[second] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
