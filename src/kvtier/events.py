"""KV events: which chunk moved from which tier to which.

The manager records one event whenever a chunk appears in, moves between, or leaves a tier. Tier
names are ``accelerator``, ``host`` and the names of the secondary tiers; a destination of
``None`` means the chunk is gone from the source. Sequence numbers increase by one per event.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from kvtier.keys import ChunkKey


class EventKind(enum.Enum):
    STORED = "stored"  # accelerator -> host
    WRITTEN = "written"  # host -> secondary tier
    PROMOTED = "promoted"  # secondary tier -> host
    EVICTED = "evicted"  # host -> gone
    REMOVED = "removed"  # secondary tier -> gone


@dataclass(frozen=True)
class KVEvent:
    seq: int
    kind: EventKind
    key: ChunkKey
    source: str
    destination: str | None
    locality: str = "local"


class EventLog:
    """Numbers events and buffers up to ``max_events`` of them until ``take``.

    When nobody takes events, the oldest are dropped (and counted in ``dropped``) so an unread
    log never grows without bound.
    """

    def __init__(self, max_events: int = 100_000) -> None:
        self._seq = 0
        self._events: deque[KVEvent] = deque(maxlen=max_events)
        self.dropped = 0

    def add(
        self, kind: EventKind, keys: list[ChunkKey], source: str, destination: str | None
    ) -> None:
        overflow = len(self._events) + len(keys) - (self._events.maxlen or 0)
        self.dropped += max(0, overflow)
        for key in keys:
            self._events.append(KVEvent(self._seq, kind, key, source, destination))
            self._seq += 1

    def take(self) -> list[KVEvent]:
        events = list(self._events)
        self._events.clear()
        return events
