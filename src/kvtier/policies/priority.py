"""Priority retention: one eviction policy per priority level, the lowest level evicted first.

TensorRT-LLM's retention semantics: every resident key has a priority from 0 to 100
(``DEFAULT_PRIORITY`` unless told otherwise); eviction takes keys of lower priority first and,
within a level, follows that level's own policy (LRU recency, or ARC). Keys only move between
levels through ``set_priority``. ``RetainedPolicy`` adds priorities that end: expired ones drop
back to the default before an eviction, the key there the least recently used (retention, not
use, kept it until then). Host memory (``HostTier``) and vLLM's host memory under kvtier's cache
policy (``PriorityCache``) both keep their retention in one.

With every key at the default priority there is one level and ``evict`` is that policy's own.

What a request may ask for is checked and capped here too, for every engine path alike:
``checked_priority`` and ``checked_duration`` (numbers of any size: a ``ValueError``, never an
``OverflowError``), ``RequestLimits`` (the operator's ``max_request_priority`` and
``max_request_duration_s``), and ``OperatorRetention`` (keys whose retention the operator gave,
which no request's retention changes while it lasts).
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Callable, Container, Hashable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Generic, TypeVar

from kvtier.errors import shown
from kvtier.policies import EvictionPolicy

K = TypeVar("K", bound=Hashable)

MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = 0, 100, 35
#: The highest priority a request may ask for unless the operator says otherwise: 91-100 stay
#: the operator's, so a prefix the operator retains there outranks every request's chunks.
DEFAULT_MAX_REQUEST_PRIORITY = 90


def checked_priority(value: object) -> int:
    """``value`` as a retention priority: an integer from 0 to 100 (never a bool), else
    ``ValueError`` saying why. The one check of the range, wherever a priority comes from."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"expected an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, got {shown(value)}"
        )
    number = int(value)
    if not MIN_PRIORITY <= number <= MAX_PRIORITY:
        raise ValueError(f"expected {MIN_PRIORITY} to {MAX_PRIORITY}, got {shown(number)}")
    return number


def checked_duration(value: object) -> float:
    """``value`` as a retention duration in seconds: a real number (never a bool) that is a
    finite float above 0, else ``ValueError``. An int or fraction past the floats is refused
    (``float`` would raise ``OverflowError``), and so is one that rounds to 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"expected a finite number > 0, got {shown(value)}")
    try:
        seconds = float(value)
    except (OverflowError, ValueError):
        seconds = math.inf
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"expected a finite number > 0, got {shown(value)}")
    return seconds


@dataclass(frozen=True)
class RequestLimits:
    """The operator's caps on the retention a request may ask for (``max_request_priority``,
    ``max_request_duration_s``); the operator's own retention is never capped."""

    max_priority: int = DEFAULT_MAX_REQUEST_PRIORITY
    max_duration_s: float | None = None

    def clamp(self, priority: int, duration_s: float | None) -> tuple[int, float | None]:
        """``priority`` for ``duration_s`` seconds (``None``: for good) within the caps. A
        retention at the default priority has no duration to cap (it ends where it is)."""
        priority = min(priority, self.max_priority)
        cap = self.max_duration_s
        if cap is not None and priority != DEFAULT_PRIORITY:
            duration_s = cap if duration_s is None else min(duration_s, cap)
        return priority, duration_s


class OperatorRetention(Generic[K]):
    """Keys whose retention the operator gave, while it lasts: no request's retention changes
    them (neither lowers nor raises), whatever the caps.

    It lasts until ``until`` (the caller's clock; ``None``: for good) and while the key keeps
    the priority given: once the key left (evicted, removed) or its priority ended, it is over.
    """

    def __init__(self) -> None:
        self._given: dict[K, tuple[int, float | None]] = {}

    def give(self, key: K, priority: int, until: float | None) -> None:
        self._given[key] = (priority, until)

    def lift(self, key: K) -> None:
        self._given.pop(key, None)

    def holds(self, key: K, priority: int | None, now: float) -> bool:
        """Whether the operator's retention of ``key`` (now at ``priority``; ``None`` when not
        known yet, e.g. still being written) still lasts; forgotten once it does not."""
        given = self._given.get(key)
        if given is None:
            return False
        if (priority is not None and priority != given[0]) or (
            given[1] is not None and now >= given[1]
        ):
            del self._given[key]
            return False
        return True

    def prune(self, keep: Callable[[K], bool]) -> None:
        """Forget the keys ``keep`` rejects (e.g. those no longer resident)."""
        self._given = {k: v for k, v in self._given.items() if keep(k)}

    def __len__(self) -> int:
        return len(self._given)


class PrioritizedPolicy(Generic[K]):
    """Priority levels over policies made by ``make`` (one per level in use)."""

    def __init__(self, make: Callable[[], EvictionPolicy[K]]) -> None:
        self._make = make
        self._levels: dict[int, EvictionPolicy[K]] = {DEFAULT_PRIORITY: make()}
        self._priority: dict[K, int] = {}  # keys away from the default level only

    def add(self, key: K, priority: int = DEFAULT_PRIORITY, oldest: bool = False) -> None:
        if priority == DEFAULT_PRIORITY and not self._priority:  # the common case, kept cheap
            self._levels[DEFAULT_PRIORITY].add(key, oldest)
            return
        self._priority.pop(key, None)
        if priority != DEFAULT_PRIORITY:
            self._priority[key] = priority
        self._level(priority).add(key, oldest)

    def touch(self, key: K) -> None:
        self._levels[self._priority.get(key, DEFAULT_PRIORITY)].touch(key)

    def refresh(self, key: K) -> None:
        self._levels[self._priority.get(key, DEFAULT_PRIORITY)].refresh(key)

    def touch_all(self, keys: Iterable[K], use: bool = True) -> None:
        """``touch`` each key in turn (``refresh`` without ``use``)."""
        if self._priority:
            each = self.touch if use else self.refresh
            for key in keys:
                each(key)
            return
        level = self._levels[DEFAULT_PRIORITY]  # every key is at the default level
        each = level.touch if use else level.refresh
        for key in keys:
            each(key)

    def remove(self, key: K) -> None:
        priority = self._priority.pop(key, DEFAULT_PRIORITY)
        level = self._levels.get(priority)
        if level is not None:
            level.remove(key)

    def set_priority(self, key: K, priority: int, oldest: bool = False) -> None:
        """Move a resident key to ``priority``, as most recently used there (or least)."""
        if key in self and priority != self.priority_of(key):
            self.remove(key)
            self.add(key, priority, oldest)

    def priority_of(self, key: K) -> int:
        return self._priority.get(key, DEFAULT_PRIORITY)

    def evict(self, n: int, protected: Container[K]) -> list[K] | None:
        """Exactly ``n`` unprotected keys, lowest priority first; ``None`` (nothing) if short."""
        if len(self._levels) == 1:
            return self._levels[DEFAULT_PRIORITY].evict(n, protected)
        counts, remaining = [], n
        for priority in sorted(self._levels):
            take = _count_unprotected(self._levels[priority], protected, remaining)
            counts.append((priority, take))
            remaining -= take
            if not remaining:
                break
        if remaining:
            return None
        victims = [k for p, take in counts for k in self._evict_level(p, take, protected)]
        return victims

    def _evict_level(self, priority: int, n: int, protected: Container[K]) -> list[K]:
        victims = self._levels[priority].evict(n, protected) or []
        for key in victims:
            self._priority.pop(key, None)
        if priority != DEFAULT_PRIORITY and not self._levels[priority]:
            del self._levels[priority]
        return victims

    def _level(self, priority: int) -> EvictionPolicy[K]:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = self._make()
        return level

    def __len__(self) -> int:
        return sum(len(level) for level in self._levels.values())

    def __contains__(self, key: object) -> bool:
        level = self._levels.get(self._priority.get(key, DEFAULT_PRIORITY))  # type: ignore[arg-type]
        return level is not None and key in level

    def __iter__(self) -> Iterator[K]:
        for priority in sorted(self._levels):
            yield from self._levels[priority]


def _count_unprotected(level: EvictionPolicy[K], protected: Container[K], limit: int) -> int:
    return sum(1 for _ in islice((k for k in level if k not in protected), limit))


class Expiries(Generic[K]):
    """When keys' retention priorities end (``until``, on the caller's clock); no I/O.

    ``set`` replaces a key's earlier end, ``forget`` drops it, ``due(now)`` takes the keys whose
    end has come (each once). Superseded heap entries are dropped lazily, and the heap is
    rebuilt when they outnumber the live ones, so its size stays bounded by the keys tracked.
    """

    def __init__(self) -> None:
        self._until: dict[K, float] = {}
        self._heap: list[tuple[float, K]] = []

    def set(self, key: K, until: float | None) -> None:
        self._until.pop(key, None)
        if until is None:
            return
        self._until[key] = until
        heapq.heappush(self._heap, (until, key))
        if len(self._heap) > 2 * len(self._until) + 64:
            self._heap = [(t, k) for k, t in self._until.items()]
            heapq.heapify(self._heap)

    def forget(self, key: K) -> None:
        self._until.pop(key, None)

    def due(self, now: float) -> list[K]:
        keys = []
        while self._heap and self._heap[0][0] <= now:
            until, key = heapq.heappop(self._heap)
            if self._until.get(key) == until:
                del self._until[key]
                keys.append(key)
        return keys


class RetainedPolicy(PrioritizedPolicy[K]):
    """Priority levels whose priorities may end (``until`` on the caller's ``clock``, e.g.
    ``time.monotonic``; ``None``: never).

    ``add`` and ``retain`` set a key's priority and its end (replacing any earlier end);
    ``remove`` and eviction forget it; ``evict`` first drops every priority whose end has come
    back to the default, as the least recently used key there.
    """

    def __init__(self, make: Callable[[], EvictionPolicy[K]], clock: Callable[[], float]) -> None:
        super().__init__(make)
        self._clock = clock
        self._ends: Expiries[K] = Expiries()

    def add(
        self,
        key: K,
        priority: int = DEFAULT_PRIORITY,
        oldest: bool = False,
        until: float | None = None,
    ) -> None:
        super().add(key, priority, oldest)
        self._ends.set(key, until)

    def retain(self, key: K, priority: int, until: float | None) -> None:
        """A resident key's new priority, until ``until`` (its earlier end, if any, is gone)."""
        self.set_priority(key, priority)
        self._ends.set(key, until)

    def remove(self, key: K) -> None:
        super().remove(key)
        self._ends.forget(key)

    def evict(self, n: int, protected: Container[K]) -> list[K] | None:
        for key in self._ends.due(self._clock()):
            self.set_priority(key, DEFAULT_PRIORITY, oldest=True)
        victims = super().evict(n, protected)
        for key in victims or ():
            self._ends.forget(key)
        return victims
