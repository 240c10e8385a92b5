"""Promotion: bringing chunks back from secondary tiers into host slots, and why it failed.

``Promoter.lookup_beyond`` continues a lookup past the chunks ready in host: it walks the keys in
prefix order, asks the tiers in configured order for each, and tells the first holder to promote
the chunk into a reserved host slot (one job per tier, however many keys). The answer is
``RETRY`` until the promotions land. A chunk whose promotion failed is never asked of the same
tier again until it is stored anew (no livelock). When the walk stops at a chunk held nowhere,
the chunks from there on are recomputed and counted under one reason (``MISS_REASONS``).

``Promoter.lookup_window`` serves layouts whose layers resume from a trailing window of chunks
(sliding-window and state-space layers, ``KVLayout.window_chunks``): a prefix of ``n`` chunks can
be resumed once its last ``window`` chunks are in host, because the key of chunk ``i`` names the
whole prefix up to ``i``. The chunks before the window are never looked up nor promoted.

``Promoter.promote_for_peer`` serves a peer server: it promotes the keys a peer asked for from
this instance's own storage tiers, without a prefix walk and without engine-facing metrics.

Thread safety: none; it belongs to the manager's thread.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from itertools import count

from kvtier.events import EventKind, EventLog
from kvtier.host import PROTECT, WRITING, HostTier
from kvtier.keys import ChunkKey
from kvtier.logs import ThrottledLog
from kvtier.metrics import ManagerMetrics
from kvtier.tiers.base import HIT, MISS, RETRY, JobResult, Lookup, Op, SecondaryTier, TransferJob

log = logging.getLogger(__name__)
warn = ThrottledLog(log)

#: How many promotion failures and evictions are remembered (for no-livelock and miss reasons).
MEMORY = 1 << 16
#: Keys a lookup may leave unknown (tier probes started) before it stops walking (``_walk``).
PROBE_AHEAD = 16

Allocate = Callable[[list[ChunkKey], Sequence[ChunkKey]], "list[int] | None"]


@dataclass(frozen=True)
class PendingJob:
    op: Op
    tier: int
    keys: tuple[ChunkKey, ...]
    owner: Hashable = None  # the host-slot holds a store job keeps until it reports
    started: float = field(default_factory=time.monotonic)


class JobBook:
    """Jobs handed to tiers and not yet reported back."""

    def __init__(self) -> None:
        self._ids = count()
        self._pending: dict[int, PendingJob] = {}

    def new(
        self, op: Op, tier: int, keys: list[ChunkKey], slots: list[int], owner: Hashable = None
    ) -> TransferJob:
        job = TransferJob(next(self._ids), tuple(keys), tuple(slots))
        self._pending[job.job_id] = PendingJob(op, tier, job.keys, owner)
        return job

    def finish(self, tier: int, job_id: int) -> PendingJob | None:
        """The pending job ``job_id`` of ``tier``, removed; ``None`` if there is no such job."""
        pending = self._pending.get(job_id)
        if pending is None or pending.tier != tier:
            return None
        return self._pending.pop(job_id)

    def __len__(self) -> int:
        return len(self._pending)


def submit(
    tier: SecondaryTier, op: Op, job: TransferJob, metrics: ManagerMetrics
) -> JobResult | None:
    """Hand ``job`` to ``tier``; if the tier raises, the failed result to apply at once."""
    try:
        (tier.submit_store if op == "store" else tier.submit_load)(job)
    except Exception as exc:
        warn.warning(f"{op}:{tier.name}", "tier %s refused a %s: %s", tier.name, op, exc)
        metrics.count("tier_errors", tier=tier.name, where="submit")
        return JobResult(job.job_id, op, frozenset(), frozenset(job.keys), str(exc))
    return None


class Bounded(OrderedDict[tuple[int, ChunkKey] | ChunkKey, str]):
    """An insertion-ordered map that forgets its oldest entries beyond ``MEMORY``."""

    def remember(self, key: tuple[int, ChunkKey] | ChunkKey, value: str) -> None:
        self[key] = value
        while len(self) > MEMORY:
            self.popitem(last=False)


@dataclass
class Walk:
    """What a walk past the ready prefix found."""

    waiting: bool = False
    wanted: list[tuple[int, ChunkKey]] = field(default_factory=list)
    stop_reason: str | None = None
    stopped_at: int | None = None  # index of the key the walk stopped at


class Promoter:
    """Promotions from secondary tiers into host memory, for one manager."""

    def __init__(
        self,
        host: HostTier,
        tiers: list[SecondaryTier],
        jobs: JobBook,
        metrics: ManagerMetrics,
        events: EventLog,
        allocate: Allocate,
    ) -> None:
        self.host, self.tiers, self.jobs = host, tiers, jobs
        self.metrics, self.events, self.allocate = metrics, events, allocate
        self.promoting: dict[ChunkKey, int] = {}
        self.promoted_from = Bounded()  # key -> tier name, until the chunk is loaded
        self.failed = Bounded()  # (tier, key) -> "integrity" | "io"
        self.evicted = Bounded()  # key -> ""

    def lookup_beyond(self, keys: Sequence[ChunkKey], ready: int) -> int | Lookup:
        """Continue a lookup whose first ``ready`` keys are ready in host."""
        walk = self._walk(keys[ready:])
        if walk.waiting or self._start(walk.wanted, keys[:ready]):
            return RETRY
        reason = "host_full" if walk.wanted else walk.stop_reason
        if walk.wanted:
            self.metrics.count("lookup_host_full")
        if reason is not None:
            self.metrics.count("recomputed_chunks", len(keys) - ready, reason=reason)
        return ready

    def lookup_window(self, keys: Sequence[ChunkKey], window: int) -> int | Lookup:
        """Longest prefix of ``keys`` whose last ``window`` chunks are ready in host, or RETRY.

        The whole prefix is tried first; a chunk of its window held nowhere moves the prefix's
        end before that chunk. The first window whose every chunk is held somewhere has its
        missing chunks promoted (``RETRY`` until they land).
        """
        end, reason = len(keys), None
        while end > 0:
            start = max(0, end - window)
            walk = self._walk(keys[start:end])
            if walk.stopped_at is None:
                return self._finish_window(keys, start, end, walk, reason)
            reason = reason or walk.stop_reason
            end = start + walk.stopped_at
        self._count_recomputed(len(keys), reason)
        return 0

    def _finish_window(self, keys: Sequence[ChunkKey], start: int, end: int, walk: Walk,
                       reason: str | None) -> int | Lookup:  # fmt: skip
        ready = [k for k in keys[start:end] if self.host.is_ready(k)]
        if walk.waiting or self._start(walk.wanted, ready):
            return RETRY
        if walk.wanted:
            self.metrics.count("lookup_host_full")
            end, reason = 0, "host_full"
        self._count_recomputed(len(keys) - end, reason)
        return end

    def _count_recomputed(self, num_chunks: int, reason: str | None) -> None:
        if num_chunks and reason is not None:
            self.metrics.count("recomputed_chunks", num_chunks, reason=reason)

    def promote_for_peer(self, keys: Sequence[ChunkKey]) -> set[ChunkKey]:
        """Start promoting, for a peer, the ``keys`` not in host; returns the keys on their way.

        On their way: being written into host (a store or a promotion), held by a tier whose
        answer is pending, or promoted by this call. Each key is independent (no prefix walk).
        Tiers that read other instances (``reads_peers``) are not asked, so two servers never
        relay a lookup to each other; a (tier, key) whose promotion failed is not asked again.
        Promotions take free or evictable slots only, never one held nor one of ``keys`` ready
        now; what does not fit is not promoted. No engine-facing metric is counted.
        """
        coming: set[ChunkKey] = set()
        wanted: list[tuple[int, ChunkKey]] = []
        for key in dict.fromkeys(keys):
            if key in self.host:
                if not self.host.is_ready(key):
                    coming.add(key)
                continue
            holder, _ = self._find_holder(key, ask_peers=False)
            if isinstance(holder, int):
                wanted.append((holder, key))
            elif holder is RETRY:
                coming.add(key)
        ready = [k for k in dict.fromkeys(keys) if self.host.is_ready(k)]
        return coming | self._start(wanted, ready)

    def _start(
        self, wanted: list[tuple[int, ChunkKey]], protect: Sequence[ChunkKey]
    ) -> set[ChunkKey]:
        """Promote what fits of ``wanted`` without evicting ``protect``; the keys started."""
        self.host.hold(protect, PROTECT)
        try:
            room = self.host.num_allocatable
            groups = _by_tier(wanted[:room]).items()
            return {k for i, ks in groups if self._promote(i, ks) for k in ks}
        finally:
            self.host.release(protect, PROTECT)

    def _walk(self, keys: Sequence[ChunkKey]) -> Walk:
        """Walk keys past the ready prefix until one is held nowhere, or too many are unknown.

        A tier answers RETRY for a key it has to probe (a stat, a peer round trip). Probing the
        whole prefix would start a probe per key although the first miss ends the prefix, so a
        walk stops after ``PROBE_AHEAD`` unknown keys, or as many as it found held before them
        if more: a cold prefix costs a bounded number of probes, and a prefix held in a tier is
        still probed in a few lookups (the budget doubles each time).
        """
        walk = Walk()
        unknown = 0
        for index, key in enumerate(keys):
            state = self.host.state_of(key)
            if state is not None:
                if state == WRITING and key not in self.promoting:
                    walk.stop_reason, walk.stopped_at = "store_in_flight", index
                    return walk
                walk.waiting = walk.waiting or state == WRITING
                continue
            holder, unavailable = self._find_holder(key)
            if holder is MISS:
                walk.stop_reason = self._miss_reason(key, unavailable)
                walk.stopped_at = index
                return walk
            if isinstance(holder, int):
                walk.wanted.append((holder, key))
                continue
            walk.waiting, unknown = True, unknown + 1
            if unknown >= max(PROBE_AHEAD, index + 1 - unknown):
                return walk
        return walk

    def _find_holder(self, key: ChunkKey, ask_peers: bool = True) -> tuple[int | Lookup, bool]:
        """The first tier that holds ``key`` (or RETRY, or MISS), and whether a tier was down."""
        maybe = unavailable = False
        for index, tier in enumerate(self.tiers):
            if (index, key) in self.failed or (tier.reads_peers and not ask_peers):
                continue
            answer = self._ask(tier, key)
            unavailable = unavailable or answer is None or not tier.available
            if answer is HIT:
                return index, unavailable
            maybe = maybe or answer is RETRY
        return (RETRY if maybe else MISS), unavailable

    def _ask(self, tier: SecondaryTier, key: ChunkKey) -> Lookup | None:
        try:
            answer = tier.lookup(key)
        except Exception as exc:
            warn.warning(f"lookup:{tier.name}", "tier %s lookup failed: %s", tier.name, exc)
            self.metrics.count("tier_errors", tier=tier.name, where="lookup")
            self.metrics.count("tier_lookups", tier=tier.name, result="error")
            return None
        self.metrics.count("tier_lookups", tier=tier.name, result=answer.value)
        return answer

    def _miss_reason(self, key: ChunkKey, unavailable: bool) -> str:
        failures = {self.failed.get((i, key)) for i in range(len(self.tiers))}
        if "integrity" in failures:
            return "integrity_failure"
        if "io" in failures:
            return "promotion_failed"
        if unavailable:
            return "tier_unavailable"
        return "evicted" if key in self.evicted else "never_stored"

    def _promote(self, index: int, keys: list[ChunkKey]) -> bool:
        slots = self.allocate(keys, ())
        if slots is None:
            return False
        job = self.jobs.new("load", index, keys, slots)
        for key in keys:
            self.promoting[key] = index
        refused = submit(self.tiers[index], "load", job, self.metrics)
        if refused is None:
            return True
        pending = self.jobs.finish(index, job.job_id)
        assert pending is not None
        self.finish(index, pending, refused)
        return False

    def finish(self, index: int, pending: PendingJob, result: JobResult) -> None:
        """A promotion job reported: the keys that arrived become ready, the others are freed."""
        ok = [k for k in pending.keys if k in result.succeeded]
        bad = [k for k in pending.keys if k not in result.succeeded]
        for key in pending.keys:
            del self.promoting[key]
        self.host.complete_write(ok, success=True)
        self.host.complete_write(bad, success=False)
        name = self.tiers[index].name
        self.events.add(EventKind.PROMOTED, ok, name, "host", self.tiers[index].locality)
        for key in ok:
            self.promoted_from.remember(key, name)
        for key in bad:
            reason = "integrity" if key in result.integrity_failed else "io"
            self.failed.remember((index, key), reason)
        if result.integrity_failed:
            self.metrics.count("tier_integrity_failures", len(result.integrity_failed), tier=name)

    def forget_failures(self, keys: list[ChunkKey]) -> None:
        """Keys stored anew: every tier may be asked for them again."""
        for key in keys:
            for index in range(len(self.tiers)):
                self.failed.pop((index, key), None)

    def source_of(self, key: ChunkKey) -> str:
        """Where a chunk being loaded came from: ``host``, or the tier it was promoted from."""
        return self.promoted_from.pop(key, "host") if self.promoted_from else "host"


def _by_tier(wanted: list[tuple[int, ChunkKey]]) -> dict[int, list[ChunkKey]]:
    groups: dict[int, list[ChunkKey]] = {}
    for index, key in wanted:
        groups.setdefault(index, []).append(key)
    return groups
