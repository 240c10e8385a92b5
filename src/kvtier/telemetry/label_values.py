"""LabelValues: the values one metric label takes, bounded; the rest share ``OTHER``.

A label whose values come from outside (the ``reason`` an operator gives a tier switch, over
the admin endpoint) would otherwise add a time series for every new value, for as long as the
process runs: each costs the scrape and the monitoring system memory. The first ``limit``
values seen keep their own series, as do the ``known`` values (kvtier's own, whenever they
come); later ones are counted under ``OTHER``. Logs and records keep the value itself.

Thread safety: none; its owner calls it under its own lock.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The value that stands for every value past the limit.
OTHER = "other"


class LabelValues:
    """``known`` values and at most ``limit`` distinct others of one label, then ``OTHER``."""

    def __init__(self, limit: int, known: Iterable[str] = ()) -> None:
        self._known = frozenset(known)
        self._seen: set[str] = set()
        self._limit = limit

    def __call__(self, value: str) -> str:
        """``value`` when it is known, already seen or there is room for it, else ``OTHER``."""
        if value in self._known or value in self._seen:
            return value
        if len(self._seen) >= self._limit:
            return OTHER
        self._seen.add(value)
        return value
