"""HostTier: which chunk lives in which host slot, slot states, and eviction through a policy.

Each resident key has a slot and one integer state:

* ``WRITING`` (-1): bytes are being written (an engine store or a promotion); not readable and
  not evictable;
* ``0``: ready and evictable;
* ``n > 0``: ready and held ``n`` times (readers copying out, or secondary tiers copying the
  slot during write-through); not evictable.

Each slot being written records its *writer* (the engine, or a promotion from a tier), so only
the engine's own ``complete_store`` can make it ready. Holds are counted per *owner* (any
hashable: the engine, one write-through job, one peer): an owner can only release what it holds,
so a stray or repeated release raises ``HoldError`` and changes nothing, and a slot stays
unevictable until every owner that reads it has released it.

Every allocation of a slot bumps its *generation* (``generation``): bytes read out of a slot
while its generation is unchanged are the chunk that was ready there.

Thread safety: none, but for ``generation`` (any thread); the host tier belongs to the
manager's thread.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

from kvtier.errors import HoldError
from kvtier.keys import ChunkKey
from kvtier.policies import make_policy
from kvtier.policies.priority import DEFAULT_PRIORITY, RetainedPolicy

WRITING = -1

__all__ = [
    "ENGINE",
    "PEER",
    "PROTECT",
    "WRITING",
    "HoldError",
    "HostTier",
    "Promotion",
    "WriteThrough",
]


#: Hold owners: the engine (``prepare_load``), a lookup protecting its ready prefix, peers.
#: ``ENGINE`` is also the writer of the slots ``prepare_store`` reserves.
ENGINE, PROTECT, PEER = "engine", "protect", "peer"


@dataclass(frozen=True)
class Promotion:
    """The writer of slots being filled from secondary tier ``tier``."""

    tier: str


@dataclass(frozen=True, eq=False)
class WriteThrough:
    """The owner of one write-through job's holds (distinct per job: compared by identity)."""

    tier: str


class _Held:
    """The ``protected`` set handed to policies: keys whose state is not 0."""

    __slots__ = ("_states",)

    def __init__(self, states: dict[ChunkKey, list[int]]) -> None:
        self._states = states

    def __contains__(self, key: object) -> bool:
        entry = self._states.get(key)  # type: ignore[call-overload]
        return entry is not None and entry[1] != 0


class HostTier:
    """Slot bookkeeping for ``num_slots`` host slots with an ``lru`` or ``arc`` policy."""

    def __init__(
        self, num_slots: int, policy: str = "lru", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.num_slots = num_slots
        self._policy = RetainedPolicy[ChunkKey](lambda: make_policy(policy, num_slots), clock)
        self._pending: dict[ChunkKey, tuple[int, float | None]] = {}  # priority of WRITING keys
        self._entries: dict[ChunkKey, list[int]] = {}  # key -> [slot, state]
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._generations = [0] * num_slots  # allocations of each slot so far
        self._held = _Held(self._entries)
        self._num_pinned = 0  # ready entries with state > 0
        self._holds: dict[Hashable, dict[ChunkKey, int]] = {}  # owner -> key -> holds
        self._writers: dict[ChunkKey, Hashable] = {}  # key in state WRITING -> who writes it

    # -- queries ---------------------------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def is_ready(self, key: ChunkKey) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry[1] >= 0

    def not_ready(self, keys: Iterable[ChunkKey]) -> list[ChunkKey]:
        """The ``keys`` that are absent or being written."""
        get = self._entries.get
        return [key for key in keys if (entry := get(key)) is None or entry[1] < 0]

    def slot_of(self, key: ChunkKey) -> int:
        return self._entries[key][0]

    def generation(self, slot: int) -> int:
        """How many times ``slot`` was allocated; any thread may ask (one list read)."""
        return self._generations[slot]

    def writer_of(self, key: ChunkKey) -> Hashable | None:
        """Who is writing ``key`` (the engine, a promotion); ``None`` unless it is WRITING."""
        return self._writers.get(key)

    def state_of(self, key: ChunkKey) -> int | None:
        entry = self._entries.get(key)
        return None if entry is None else entry[1]

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_held(self) -> int:
        """Slots not evictable now: being written, or ready and held."""
        return len(self._entries) - len(self._policy) + self._num_pinned

    @property
    def num_allocatable(self) -> int:
        """How many slots ``allocate`` can hand out now (free, or held by evictable chunks)."""
        return len(self._free) + len(self._policy) - self._num_pinned

    def snapshot(self) -> dict[str, int]:
        """Slot counts: ``num_slots``, ``used_slots``, ``free_slots``, ``held_slots``."""
        return {
            "num_slots": self.num_slots,
            "used_slots": len(self._entries),
            "free_slots": len(self._free),
            "held_slots": self.num_held,
        }

    # -- allocation ------------------------------------------------------------------------
    def allocate(
        self, keys: Sequence[ChunkKey], writer: Hashable = ENGINE
    ) -> tuple[list[int], list[ChunkKey]] | None:
        """Reserve a slot in state ``WRITING`` by ``writer`` for each key (none may be resident).

        Evicts through the policy when free slots run out. Returns ``(slots, evicted_keys)``, or
        ``None`` with nothing changed when not enough slots can be freed.
        """
        shortfall = len(keys) - len(self._free)
        evicted: list[ChunkKey] = []
        if shortfall > 0:
            victims = self._policy.evict(shortfall, self._held)
            if victims is None:
                return None
            for victim in victims:
                self._free.append(self._entries.pop(victim)[0])
            evicted = victims
        slots = [self._free.pop() for _ in keys]
        for key, slot in zip(keys, slots, strict=True):
            self._generations[slot] += 1  # before any byte of the new chunk is written
            self._entries[key] = [slot, WRITING]
            self._writers[key] = writer
        return slots, evicted

    def complete_write(self, keys: Iterable[ChunkKey], success: bool) -> None:
        """Writing finished: make the keys ready, or on failure release their slots."""
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or entry[1] != WRITING:
                continue
            del self._writers[key]
            priority, until = self._pending.pop(key, (DEFAULT_PRIORITY, None))
            if success:
                entry[1] = 0
                self._policy.add(key, priority, until=until)
            else:
                self._free.append(self._entries.pop(key)[0])

    # -- holding ---------------------------------------------------------------------------
    def hold(self, keys: Iterable[ChunkKey], owner: Hashable) -> list[int]:
        """Protect ready keys from eviction (one more hold by ``owner`` each); their slots."""
        entries, held = self._entries, self._holds.setdefault(owner, {})
        slots, pinned = [], 0
        try:
            for key in keys:
                entry = entries[key]
                state = entry[1]
                assert state >= 0, "only ready chunks can be held"
                pinned += state == 0
                entry[1] = state + 1
                held[key] = held.get(key, 0) + 1
                slots.append(entry[0])
        finally:
            self._num_pinned += pinned
            if not held:
                del self._holds[owner]
        return slots

    def can_release(self, keys: Sequence[ChunkKey], owner: Hashable) -> bool:
        """Whether ``owner`` holds every key (as many times as it appears in ``keys``)."""
        get = self._holds.get(owner, {}).get
        if len(set(keys)) == len(keys):
            return all(get(key, 0) > 0 for key in keys)
        return all(get(key, 0) >= n for key, n in Counter(keys).items())

    def release(self, keys: Sequence[ChunkKey], owner: Hashable) -> None:
        """Drop one hold of ``owner`` per key; ``HoldError`` (nothing changed) if it lacks one."""
        entries, held = self._entries, self._holds.get(owner, {})
        released = unpinned = 0
        for key in keys:
            n = held.get(key, 0)
            if not n:
                break
            if n > 1:
                held[key] = n - 1
            else:
                del held[key]
            entry = entries[key]
            entry[1] -= 1
            unpinned += entry[1] == 0
            released += 1
        self._num_pinned -= unpinned
        if released < len(keys):
            self.hold(keys[:released], owner)  # puts back exactly what this call dropped
            raise HoldError(f"release by {owner!r} of chunk(s) it does not hold")
        if not held:
            self._holds.pop(owner, None)

    def held_by_kind(self, kind: type) -> set[ChunkKey]:
        """The keys held by any owner that is a ``kind`` (e.g. every ``WriteThrough``)."""
        return {
            key for owner, held in self._holds.items() if isinstance(owner, kind) for key in held
        }

    def holds_of(self, owner: Hashable) -> list[ChunkKey]:
        """Every key ``owner`` holds (once per hold), e.g. to release them all at once."""
        return [key for key, n in self._holds.get(owner, {}).items() for _ in range(n)]

    def touch(self, keys: Iterable[ChunkKey], use: bool = True) -> None:
        """Recency for resident ``keys``, the last one most recent; without ``use`` it is not
        counted as a use (ARC does not take a key seen once for a reused one)."""
        entries = self._entries
        self._policy.touch_all([key for key in keys if key in entries], use)

    # -- priority retention ----------------------------------------------------------------
    def set_priority(self, keys: Iterable[ChunkKey], priority: int, until: float | None) -> None:
        """Retention ``priority`` (0-100) for resident ``keys``, back to the default at ``until``.

        Keys being written get it once they are ready; keys not resident are ignored.
        """
        for key in keys:
            entry = self._entries.get(key)
            if entry is None:
                continue
            if entry[1] == WRITING:
                self._pending[key] = (priority, until)
                continue
            self._policy.retain(key, priority, until)

    def priority_of(self, key: ChunkKey) -> int | None:
        """The retention priority of a ready key; ``None`` for a key not ready."""
        return self._policy.priority_of(key) if self.is_ready(key) else None
