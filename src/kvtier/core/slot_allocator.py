"""SlotAllocator: host slots for the engine's stores and for promotions, evicting as needed.

Both the manager (``prepare_store``) and the promoter reserve slots here, so every eviction is
counted, becomes an ``EVICTED`` event and is remembered by ``Provenance`` in one place. A
reservation never evicts the chunks it is told to protect (a lookup's ready prefix): they are
held by ``PROTECT`` for the moment of the allocation.

Thread safety: none; it belongs to the manager (called under its lock).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager

from kvtier.core.host_slots import ENGINE, PROTECT, HostTier
from kvtier.core.provenance import Provenance
from kvtier.keys import ChunkKey
from kvtier.telemetry.kv_events import EventKind, EventLog
from kvtier.telemetry.metrics import ManagerMetrics


class SlotAllocator:
    """Reserves host slots through ``HostTier.allocate`` and accounts for what it evicted."""

    def __init__(
        self, host: HostTier, provenance: Provenance, metrics: ManagerMetrics, events: EventLog
    ) -> None:
        self._host, self._provenance = host, provenance
        self._metrics, self._events = metrics, events

    def allocate(
        self, keys: list[ChunkKey], protect: Sequence[ChunkKey] = (), writer: Hashable = ENGINE
    ) -> list[int] | None:
        """Slots for ``keys`` (state WRITING by ``writer``), never evicting ``protect``.

        ``None``, with nothing changed, when not enough slots can be freed.
        """
        if not keys:
            return []
        with self.protecting(protect):
            allocation = self._host.allocate(keys, writer)
        if allocation is None:
            return None
        slots, evicted = allocation
        self._metrics.count("evicted_chunks", len(evicted))
        self._events.add(EventKind.EVICTED, evicted, "host", None)
        self._provenance.evicted(evicted)
        return slots

    @contextmanager
    def protecting(self, keys: Sequence[ChunkKey]) -> Iterator[None]:
        """Ready ``keys`` cannot be evicted inside the ``with`` block."""
        self._host.hold(keys, PROTECT)
        try:
            yield
        finally:
            self._host.release(keys, PROTECT)
