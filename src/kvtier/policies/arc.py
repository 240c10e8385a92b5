"""Adaptive Replacement Cache (Megiddo & Modha), with eviction decoupled from insertion.

Resident keys live in T1 (seen once recently) or T2 (seen at least twice). Evicted keys are
remembered as ghosts in B1 or B2; a ghost hit moves the target size ``p`` of T1 towards the list
that would have kept the key. A one-time scan only ever fills T1, so a reused set in T2 survives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Hashable, Iterator
from itertools import chain
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


def _unprotected(keys: OrderedDict[K, None], protected: Container[K]) -> Iterator[K]:
    return (k for k in keys if k not in protected)


class ARCPolicy(Generic[K]):
    """ARC for a cache of ``capacity`` resident keys."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.p = 0.0
        self.t1: OrderedDict[K, None] = OrderedDict()
        self.t2: OrderedDict[K, None] = OrderedDict()
        self.b1: OrderedDict[K, None] = OrderedDict()
        self.b2: OrderedDict[K, None] = OrderedDict()

    def add(self, key: K, oldest: bool = False) -> None:
        self._admit(key)
        if oldest:
            (self.t1 if key in self.t1 else self.t2).move_to_end(key, last=False)

    def _admit(self, key: K) -> None:
        if key in self.b1:
            self.p = min(self.capacity, self.p + max(1.0, len(self.b2) / len(self.b1)))
            del self.b1[key]
            self.t2[key] = None
        elif key in self.b2:
            self.p = max(0.0, self.p - max(1.0, len(self.b1) / len(self.b2)))
            del self.b2[key]
            self.t2[key] = None
        else:
            self.t1[key] = None
        self._trim_ghosts()

    def touch(self, key: K) -> None:
        if key in self.t1:
            del self.t1[key]
            self.t2[key] = None
        elif key in self.t2:
            self.t2.move_to_end(key)

    def refresh(self, key: K) -> None:
        if key in self.t1:
            self.t1.move_to_end(key)
        elif key in self.t2:
            self.t2.move_to_end(key)

    def remove(self, key: K) -> None:
        self.t1.pop(key, None)
        self.t2.pop(key, None)

    def evict(self, n: int, protected: Container[K]) -> list[K] | None:
        if n <= 0:
            return []
        from_t1, from_t2 = _unprotected(self.t1, protected), _unprotected(self.t2, protected)
        victims: list[tuple[K, bool]] = []
        taken_t1 = 0
        for _ in range(n):
            prefer_t1 = len(self.t1) - taken_t1 > self.p
            first, second = (from_t1, from_t2) if prefer_t1 else (from_t2, from_t1)
            key = next(first, None)
            is_t1 = prefer_t1
            if key is None:
                key, is_t1 = next(second, None), not prefer_t1
            if key is None:
                return None
            taken_t1 += is_t1
            victims.append((key, is_t1))
        for key, is_t1 in victims:
            self._demote(key, is_t1)
        self._trim_ghosts()
        return [key for key, _ in victims]

    def _demote(self, key: K, is_t1: bool) -> None:
        if is_t1:
            del self.t1[key]
            self.b1[key] = None
        else:
            del self.t2[key]
            self.b2[key] = None

    def _trim_ghosts(self) -> None:
        while self.b1 and len(self.t1) + len(self.b1) > self.capacity:
            self.b1.popitem(last=False)
        while (self.b1 or self.b2) and len(self.b1) + len(self.b2) + len(self) > 2 * self.capacity:
            (self.b2 or self.b1).popitem(last=False)

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def __contains__(self, key: object) -> bool:
        return key in self.t1 or key in self.t2

    def __iter__(self) -> Iterator[K]:
        return chain(self.t1, self.t2)
