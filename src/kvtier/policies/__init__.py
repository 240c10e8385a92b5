"""Eviction policies: bookkeeping of which resident keys to evict, no I/O and no metrics.

A policy tracks the keys that are resident and evictable-in-principle. ``evict(n, protected)``
either evicts exactly ``n`` keys not in ``protected`` and returns them, or changes nothing and
returns ``None``.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterator
from typing import Protocol, TypeVar

from kvtier.errors import ConfigError

K = TypeVar("K", bound=Hashable)


class EvictionPolicy(Protocol[K]):
    """The contract every eviction policy implements."""

    def add(self, key: K, oldest: bool = False) -> None:
        """A key became resident (it must not be resident already), as the most recently used
        one, or with ``oldest`` as the least recently used one (the first to evict)."""

    def touch(self, key: K) -> None:
        """A resident key was used; unknown keys are ignored."""

    def refresh(self, key: K) -> None:
        """A resident key becomes the most recently used one without counting as a use (ARC
        keeps it in the list it is in: ordering a sequence just stored must not make its new
        chunks look reused); unknown keys are ignored."""

    def remove(self, key: K) -> None:
        """A resident key left for another reason; unknown keys are ignored."""

    def evict(self, n: int, protected: Container[K]) -> list[K] | None:
        """Evict exactly ``n`` keys not in ``protected``, or nothing (``None``)."""

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...

    def __iter__(self) -> Iterator[K]:
        """Every resident key (in no promised order)."""
        ...


def make_policy(name: str, capacity: int) -> EvictionPolicy[K]:
    """The policy called ``name`` (``lru`` or ``arc``) for a cache of ``capacity`` entries."""
    from kvtier.policies.arc import ARCPolicy
    from kvtier.policies.lru import LRUPolicy

    if name == "lru":
        return LRUPolicy()
    if name == "arc":
        return ARCPolicy(capacity)
    raise ConfigError(f"eviction_policy: expected 'lru' or 'arc', got {name!r}")
