"""The state behind ``KvtierPriorityPolicy``: vLLM's host chunks under kvtier's priority levels.

vLLM's ``CPUOffloadingManager`` keeps a chunk status (ref count, slot) per key in its cache
policy and asks the policy which idle chunks to evict. ``PriorityCache`` keeps those statuses,
orders the keys with kvtier's ``PrioritizedPolicy`` (LRU or ARC within a priority, the lowest
priority evicted first) and tracks which keys vLLM marked evictable (no transfer in flight);
only those, and none of the ``protected`` ones, are ever evicted.

Priorities come from ``retention.Retention`` values: given with a new chunk (``note_new``
before ``insert``) or with a use (``use``). One given for a duration drops back to the default
priority when it ends, as the least recently used chunk there (checked before each eviction).
The operator's (``Retention.operator``, from a request's ``kv_hints``) is recorded in an
``OperatorRetention``: while it lasts, no request's retention changes that chunk.

Thread safety: none needed; vLLM calls its cache policy on the scheduler thread only. Nothing
here imports vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Container, Iterable, Sequence
from typing import Generic, TypeVar

from kvtier.integrations.vllm.request_retention import Retention
from kvtier.policies import EvictionPolicy, make_policy
from kvtier.policies.priority import OperatorRetention, RetainedPolicy

C = TypeVar("C")
Key = bytes
RetentionOf = Callable[[Key], Retention | None]


class _Unevictable(Container[Key]):
    """Keys an eviction must skip: the caller's protected ones and those not marked evictable."""

    def __init__(self, protected: Container[Key], evictable: set[Key]) -> None:
        self._protected, self._evictable = protected, evictable

    def __contains__(self, key: object) -> bool:
        return key in self._protected or key not in self._evictable


class PriorityCache(Generic[C]):
    """Chunk statuses of vLLM's host tier, evicted by priority, then ``base`` (lru or arc)."""

    def __init__(
        self, capacity: int, base: str = "lru", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._make: Callable[[], EvictionPolicy[Key]] = lambda: make_policy(base, capacity)
        self._clock = clock
        self._order: RetainedPolicy[Key] = RetainedPolicy(self._make, clock)
        self.chunks: dict[Key, C] = {}
        self._evictable: set[Key] = set()
        self._pending: dict[Key, Retention] = {}  # given with keys about to be inserted
        self._operator: OperatorRetention[Key] = OperatorRetention()

    # -- residency ------------------------------------------------------------------------
    def insert(self, key: Key, chunk: C, evictable: bool) -> None:
        """A new chunk, with the retention ``note_new`` gave it (else the default priority)."""
        retention = self._pending.pop(key, None) or Retention()
        self.chunks[key] = chunk
        until = self._until(retention)
        self._order.add(key, retention.priority, until=until)
        if retention.operator:
            self._operator.give(key, retention.priority, until)
        self.mark(key, evictable)

    def remove(self, key: Key) -> None:
        del self.chunks[key]
        self._evictable.discard(key)
        self._order.remove(key)
        self._operator.lift(key)

    def clear(self) -> None:
        """Forget every chunk, pending retention and expiry."""
        self._order = RetainedPolicy(self._make, self._clock)
        self.chunks, self._evictable, self._pending = {}, set(), {}
        self._operator = OperatorRetention()

    def mark(self, key: Key, evictable: bool) -> None:
        (self._evictable.add if evictable else self._evictable.discard)(key)

    def priority_of(self, key: Key) -> int:
        return self._order.priority_of(key)

    # -- retention and use ----------------------------------------------------------------
    def note_new(self, keys: Iterable[Key], retention_of: RetentionOf | None) -> None:
        """Retentions for ``keys`` about to be inserted (only the latest call's are kept)."""
        self._pending = {}
        if retention_of is not None:
            for key in keys:
                retention = retention_of(key)
                if retention is not None:
                    self._pending[key] = retention

    def use(
        self,
        keys: Sequence[Key],
        retention_of: RetentionOf | None,
        fresh: Collection[Key] = (),
    ) -> None:
        """``keys`` (prefix order) were used: the head ends most recent. ``fresh`` ones were
        only inserted by this use: they are reordered, not counted as a second use (ARC); every
        resident key takes the retention ``retention_of`` gives it."""
        for key in reversed(keys):
            if key not in self.chunks:
                continue
            retention = retention_of(key) if retention_of is not None else None
            if retention is not None:
                self._retain(key, retention)
            (self._order.refresh if key in fresh else self._order.touch)(key)

    def _retain(self, key: Key, retention: Retention) -> None:
        """``key`` takes ``retention``: the operator's always (and recorded as such); a
        request's unless the operator's retention of ``key`` still lasts."""
        until = self._until(retention)
        if retention.operator:
            self._operator.give(key, retention.priority, until)
        elif self._operator and self._operator.holds(key, self.priority_of(key), self._clock()):
            return
        self._order.retain(key, retention.priority, until)

    # -- eviction -------------------------------------------------------------------------
    def evict(self, n: int, protected: Container[Key]) -> list[tuple[Key, C]] | None:
        """Exactly ``n`` evictable, unprotected chunks, lowest priority first; else ``None``."""
        if n == 0:
            return []
        victims = self._order.evict(n, _Unevictable(protected, self._evictable))
        if victims is None:
            return None
        for key in victims:
            self._evictable.discard(key)
            self._operator.lift(key)
        return [(key, self.chunks.pop(key)) for key in victims]

    def _until(self, retention: Retention) -> float | None:
        return None if retention.duration_s is None else self._clock() + retention.duration_s
