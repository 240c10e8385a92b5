"""Promotion: bringing chunks back from secondary tiers into host slots, and why it failed.

``Promoter.lookup`` answers the manager's ``lookup``: it counts the leading chunks ready in host,
and past them ``lookup_beyond`` walks the keys in prefix order, asks the tiers in configured order
for each, and tells the first holder to promote the chunk into a reserved host slot (one job per
tier, however many keys). The answer is ``RETRY`` until the promotions land. Chunks held before the
first key a tier is still probing are promoted at once, while the probe runs: the prefix needs them
whatever the probe finds. A chunk whose promotion failed is never asked of the same tier again
until it is stored anew (no livelock). When the walk stops at a chunk held nowhere, the chunks from
there on are recomputed and counted under one reason (``MISS_REASONS``).

Deadlines (``kvtier.core.deadlines``): a lookup stops waiting for a promotion whose tier has a
load past its deadline, and a tier that answers ``RETRY`` for one key past the probe deadline
is taken not to hold it; both are misses with reason ``tier_timeout``. A tier stalled on a load
is neither asked nor given new promotions until the late one reports.

``Promoter.lookup_window`` serves layouts whose layers resume from a trailing window of chunks
(sliding-window and state-space layers, ``KVLayout.window_chunks``): a prefix of ``n`` chunks can
be resumed once its last ``window`` chunks are in host, because the key of chunk ``i`` names the
whole prefix up to ``i``. The chunks before the window are never looked up nor promoted.

``Promoter.promote_for_peer`` serves a peer server: it promotes the keys a peer asked for from
this instance's own storage tiers, without a prefix walk and without engine-facing metrics.

The promoter owns no tier and no record of its own: it asks and submits through ``TierSet``,
reserves slots through ``SlotAllocator`` (slots it fills are written by a ``Promotion``), and
reads and records failures, sources and miss reasons in ``Provenance``.

Thread safety: none; it belongs to the manager (called under its lock).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtier.core.deadlines import ProbeAges
from kvtier.core.host_slots import ENGINE, WRITING, HostTier, Promotion
from kvtier.core.provenance import Provenance
from kvtier.core.slot_allocator import SlotAllocator
from kvtier.core.tier_set import Finished, TierSet
from kvtier.keys import ChunkKey
from kvtier.telemetry.kv_events import EventKind, EventLog
from kvtier.telemetry.metrics import ManagerMetrics
from kvtier.tiers.base import HIT, MISS, RETRY, Lookup

#: Keys a lookup may leave unknown (tier probes started) before it stops walking (``_walk``).
PROBE_AHEAD = 16


@dataclass
class Walk:
    """What a walk past the ready prefix found."""

    waiting: bool = False
    wanted: list[tuple[int, ChunkKey]] = field(default_factory=list)
    certain: int | None = None  # how many of ``wanted`` precede the first key being probed
    stop_reason: str | None = None
    stopped_at: int | None = None  # index of the key the walk stopped at


class Promoter:
    """Promotions from secondary tiers into host memory, for one manager."""

    def __init__(
        self,
        host: HostTier,
        tiers: TierSet,
        slots: SlotAllocator,
        provenance: Provenance,
        metrics: ManagerMetrics,
        events: EventLog,
    ) -> None:
        self.host, self.tiers, self.slots = host, tiers, slots
        self.provenance, self.metrics, self.events = provenance, metrics, events
        self.probes = ProbeAges(tiers.deadlines.probe_s)

    def lookup(self, keys: Sequence[ChunkKey], window: int | None) -> int | Lookup:
        """The manager's ``lookup``: the leading ``keys`` ready in host, then ``lookup_beyond``
        (``lookup_window`` for a layout that resumes from a trailing ``window``)."""
        if window is not None:
            return self.lookup_window(keys, window)
        is_ready = self.host.is_ready
        ready = 0
        for key in keys:
            if not is_ready(key):
                break
            ready += 1
        return ready if ready == len(keys) else self.lookup_beyond(keys, ready)

    def lookup_beyond(self, keys: Sequence[ChunkKey], ready: int) -> int | Lookup:
        """Continue a lookup whose first ``ready`` keys are ready in host."""
        walk = self._walk(keys[ready:])
        if walk.waiting:
            self._start(walk.wanted[: walk.certain], keys[:ready])  # overlaps the probes
            return RETRY
        if self._start(walk.wanted, keys[:ready]):
            return RETRY
        reason = "host_full" if walk.wanted else walk.stop_reason
        if walk.wanted:
            self.metrics.count("lookup_host_full")
        self.provenance.count_recomputed(len(keys) - ready, reason)
        return ready

    def lookup_window(self, keys: Sequence[ChunkKey], window: int) -> int | Lookup:
        """Longest prefix of ``keys`` whose last ``window`` chunks are ready in host, or RETRY.

        The whole prefix is tried first; a chunk of its window held nowhere moves the prefix's
        end before that chunk. The first window whose every chunk is held somewhere has its
        missing chunks promoted (``RETRY`` until they land).
        """
        start, end, walk, reason = self._resumable(keys, window)
        if walk is None:
            self.provenance.count_recomputed(len(keys), reason)
            return 0
        return self._finish_window(keys, start, end, walk, reason)

    def _resumable(
        self, keys: Sequence[ChunkKey], window: int
    ) -> tuple[int, int, Walk | None, str | None]:
        """The last ``window`` chunks ``[start, end)`` of the longest prefix whose window is
        held somewhere, with their walk (``None``: no prefix is), and why the first window
        tried was not."""
        end, reason = len(keys), None
        while end > 0:
            start = max(0, end - window)
            walk = self._walk(keys[start:end])
            if walk.stopped_at is None:
                return start, end, walk, reason
            reason = reason or walk.stop_reason
            end = start + walk.stopped_at
        return 0, 0, None, reason

    def _finish_window(
        self, keys: Sequence[ChunkKey], start: int, end: int, walk: Walk, reason: str | None
    ) -> int | Lookup:
        ready = [k for k in keys[start:end] if self.host.is_ready(k)]
        if walk.waiting or self._start(walk.wanted, ready):
            return RETRY
        if walk.wanted:
            self.metrics.count("lookup_host_full")
            end, reason = 0, "host_full"
        self.provenance.count_recomputed(len(keys) - end, reason)
        return end

    def prefetch(self, keys: Sequence[ChunkKey], window: int | None) -> None:
        """Start promoting what ``lookup`` would of the prefix ``keys`` (with a ``window``
        layout, of the window it would resume from), as far as the walk gets now; no metric
        counted. A later lookup of ``keys`` walks again and waits for these promotions like
        its own.
        """
        if window is None:
            walk: Walk | None = self._walk(keys)
        else:
            start, end, walk, _ = self._resumable(keys, window)
            keys = keys[start:end]
        if walk is None:
            return
        wanted = walk.wanted[: walk.certain] if walk.waiting else walk.wanted
        if wanted:
            self._start(wanted, [k for k in keys if self.host.is_ready(k)])

    def promote_for_peer(self, keys: Sequence[ChunkKey]) -> set[ChunkKey]:
        """Start promoting, for a peer, the ``keys`` not in host; returns the keys on their way.

        On their way: being written into host (a store or a promotion), held by a tier whose
        answer is pending, or promoted by this call. Each key is independent (no prefix walk).
        Tiers that read other instances (``reads_peers``) are not asked, so two servers never
        relay a lookup to each other; a (tier, key) whose promotion failed is not asked again.
        Promotions take free or evictable slots only, never one held nor one of ``keys`` ready
        now; what does not fit is not promoted. No engine-facing metric is counted.

        The tiers are asked about keys until ``PROBE_AHEAD`` of them are not held (a probe
        started or ran: a stat, a HEAD), or as many as were found held if more, as ``lookup``'s
        walk does: a peer's message of random keys costs a bounded number of probes, not one per
        key. Keys past that are not on their way (the peer may ask again).
        """
        coming: set[ChunkKey] = set()
        wanted: list[tuple[int, ChunkKey]] = []
        unknown, skipped = 0, self._skipped()
        for key in dict.fromkeys(keys):
            if key in self.host:
                if not self.host.is_ready(key):
                    coming.add(key)
                continue
            if unknown >= max(PROBE_AHEAD, len(wanted)):
                continue
            holder, _ = self._find_holder(key, skipped, ask_peers=False)
            if isinstance(holder, int):
                wanted.append((holder, key))
                continue
            unknown += 1  # a probe started, or just ran (a tier that stats inline)
            if holder is RETRY:
                coming.add(key)
        ready = [k for k in dict.fromkeys(keys) if self.host.is_ready(k)]
        return coming | self._start(wanted, ready)

    def _start(
        self, wanted: list[tuple[int, ChunkKey]], protect: Sequence[ChunkKey]
    ) -> set[ChunkKey]:
        """Promote what fits of ``wanted`` without evicting ``protect``; the keys started."""
        with self.slots.protecting(protect):
            room = self.host.num_allocatable
            groups = _by_tier(wanted[:room]).items()
            return {k for i, ks in groups if self._promote(i, ks) for k in ks}

    def _walk(self, keys: Sequence[ChunkKey]) -> Walk:
        """Walk keys past the ready prefix until one is held nowhere, or too many are unknown.

        A tier answers RETRY for a key it has to probe (a stat, a peer round trip). Probing the
        whole prefix would start a probe per key although the first miss ends the prefix, so a
        walk stops after ``PROBE_AHEAD`` unknown keys, or as many as it found held before them
        if more: a cold prefix costs a bounded number of probes, and a prefix held in a tier is
        still probed in a few lookups (the budget doubles each time).
        """
        walk, unknown, skipped = Walk(), 0, self._skipped()
        for index, key in enumerate(keys):
            state = self.host.state_of(key)
            if state is not None:
                if state == WRITING and (stop := self._not_awaited(key)) is not None:
                    walk.stop_reason, walk.stopped_at = stop, index
                    return walk
                walk.waiting = walk.waiting or state == WRITING
                continue
            holder, unavailable = self._find_holder(key, skipped)
            if holder is MISS:
                walk.stop_reason = self.provenance.miss_reason(key, unavailable)
                walk.stopped_at = index
                return walk
            if isinstance(holder, int):
                walk.wanted.append((holder, key))
                continue
            if walk.certain is None:
                walk.certain = len(walk.wanted)
            walk.waiting, unknown = True, unknown + 1
            if unknown >= max(PROBE_AHEAD, index + 1 - unknown):
                return walk
        return walk

    def _not_awaited(self, key: ChunkKey) -> str | None:
        """Why a lookup must not wait for ``key``, being written into host: the engine writes
        it (``store_in_flight``), or a tier switched off promotes it (``tier_disabled``: requests
        stop waiting on that tier; its job still lands, or frees the slot, when it reports).
        ``None`` for a promotion a lookup waits for."""
        writer = self.host.writer_of(key)
        if writer == ENGINE:
            return "store_in_flight"
        if not isinstance(writer, Promotion):
            return None
        if self.tiers.switched_off(writer.tier):
            return "tier_disabled"
        if self.tiers.stalled(self.tiers.index_of(writer.tier), "load"):
            return "tier_timeout"
        return None

    def _find_holder(
        self, key: ChunkKey, skipped: list[str | None], ask_peers: bool = True
    ) -> tuple[int | Lookup, str | None]:
        """The first tier that holds ``key`` (or RETRY, or MISS), and why a tier could not tell.
        ``skipped``: why each tier is not asked now (``_skipped``), or ``None`` where it is.

        The second value is ``tier_unavailable`` when a tier was down, ``tier_disabled`` when one
        is switched off, ``tier_timeout`` when one is stalled on a load (neither is asked) or
        has answered ``RETRY`` for ``key`` past the probe deadline, else ``None``.
        """
        maybe, absent = False, None
        for index, tier in enumerate(self.tiers):
            if self.provenance.has_failed(index, key) or (tier.reads_peers and not ask_peers):
                continue
            if skipped[index] is not None:
                absent = absent or skipped[index]
                continue
            answer = self.tiers.lookup(index, key)
            if answer is None or not tier.available:
                absent = "tier_unavailable"
            if answer is HIT or answer is MISS:
                self.probes.settled(index, key)
            if answer is HIT:
                return index, absent
            if answer is RETRY and self.probes.late(index, key):
                absent = absent or "tier_timeout"
                continue
            maybe = maybe or answer is RETRY
        return (RETRY if maybe else MISS), absent

    def _skipped(self) -> list[str | None]:
        """Why each tier is not asked now (``_not_asked``), once per walk: only a poll switches a
        tier off or marks it stalled, and none runs during a walk."""
        return [self._not_asked(index) for index in range(len(self.tiers))]

    def _not_asked(self, index: int) -> str | None:
        """Why tier ``index`` is not asked now: switched off, or stalled on a late load."""
        if not self.tiers.enabled(index):
            return "tier_disabled"
        return "tier_timeout" if self.tiers.stalled(index, "load") else None

    def _promote(self, index: int, keys: list[ChunkKey]) -> bool:
        slots = self.slots.allocate(keys, writer=Promotion(self.tiers[index].name))
        if slots is None:
            return False
        refused = self.tiers.submit(index, "load", keys, slots)
        if refused is None:
            return True
        self.finish(refused)
        return False

    def finish(self, finished: Finished) -> None:
        """A promotion reported: the keys that arrived become ready, the others are freed."""
        ok, bad = finished.succeeded, finished.failed
        self.host.complete_write(ok, success=True)
        self.host.complete_write(bad, success=False)
        index = finished.job.tier
        tier = self.tiers[index]
        self.events.add(EventKind.PROMOTED, ok, tier.name, "host", tier.locality)
        self.provenance.promoted(ok, tier.name)
        integrity = finished.result.integrity_failed
        for key in bad:
            self.provenance.failed(index, key, "integrity" if key in integrity else "io")


def _by_tier(wanted: list[tuple[int, ChunkKey]]) -> dict[int, list[ChunkKey]]:
    groups: dict[int, list[ChunkKey]] = {}
    for index, key in wanted:
        groups.setdefault(index, []).append(key)
    return groups
