"""Least-recently-used eviction."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable, Iterator
from itertools import islice
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class LRUPolicy(Generic[K]):
    """Evicts the least recently added or touched keys first."""

    def __init__(self) -> None:
        self._order: OrderedDict[K, None] = OrderedDict()

    def add(self, key: K, oldest: bool = False) -> None:
        self._order[key] = None
        if oldest:
            self._order.move_to_end(key, last=False)

    def touch(self, key: K) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    refresh = touch  # recency is all LRU knows of a use

    def remove(self, key: K) -> None:
        self._order.pop(key, None)

    def evict(self, n: int, protected: Container[K]) -> list[K] | None:
        if n <= 0:
            return []
        candidates = (k for k in self._order if k not in protected)
        victims = list(islice(candidates, n))
        if len(victims) < n:
            return None
        for key in victims:
            del self._order[key]
        return victims

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def __iter__(self) -> Iterator[K]:
        return iter(self._order)
