"""Write-through: the chunks the engine stored go on to the secondary tiers from their slots.

Each chosen tier gets one store job; the slots are held (``WriteThrough``) until it reports
(``finish``: then the chunks it wrote are a ``WRITTEN`` event), so no chunk a tier is still reading
is evicted. A tier gets no write-through while it is stalled on a late store (``tier_timeout``, see
``deadlines``), nor when the slots held by write-throughs would grow past ``cap`` (``tier_busy``):
a tier that hangs pins at most that share of host memory, and the engine always has slots to store
into. Each refusal is counted as not admitted (``kvtier_admission_dropped_total{tier,reason}``).

Thread safety: none; it belongs to the manager (called under its lock).
"""

from __future__ import annotations

from kvtier.core.host_slots import HostTier, WriteThrough
from kvtier.core.tier_set import Finished, TierSet
from kvtier.keys import ChunkKey
from kvtier.telemetry.kv_events import EventKind, EventLog
from kvtier.telemetry.metrics import ManagerMetrics
from kvtier.tiers.shared.lineage import Link


class WriteThroughs:
    """Starts the write-through jobs of one manager; ``cap`` bounds the slots they hold."""

    def __init__(
        self, host: HostTier, tiers: TierSet, metrics: ManagerMetrics, events: EventLog, cap: int
    ) -> None:
        self._host, self._tiers, self._metrics, self.cap = host, tiers, metrics, cap
        self._events = events

    def start(
        self, index: int, keys: list[ChunkKey], links: tuple[Link, ...] = ()
    ) -> Finished | None:
        """Tier ``index`` writes ``keys`` from their slots (or is refused, counted), with their
        ``links`` when known; a job the tier refused at once comes back to be routed."""
        name = self._tiers[index].name
        reason = self.refusal(index, keys)
        if reason is not None:
            self._metrics.count("admission_dropped", len(keys), tier=name, reason=reason)
            return None
        owner = WriteThrough(name)
        slots = self._host.hold(keys, owner)
        return self._tiers.submit(index, "store", keys, slots, owner, links)

    def finish(self, finished: Finished) -> None:
        """A write-through job reported: its slots are free to evict, its written chunks an
        event."""
        job, tier = finished.job, self._tiers[finished.job.tier]
        self._host.release(job.keys, job.owner)
        self._events.add(EventKind.WRITTEN, finished.succeeded, "host", tier.name, tier.locality)

    def refusal(self, index: int, keys: list[ChunkKey]) -> str | None:
        """Why tier ``index`` gets no write-through of ``keys`` now, or ``None``."""
        if self._tiers.stalled(index, "store"):
            return "tier_timeout"
        held = self._host.held_by_kind(WriteThrough)
        grows = not held.issuperset(keys)
        return "tier_busy" if held and grows and len(held.union(keys)) > self.cap else None
