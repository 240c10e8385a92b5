"""TierSet: a manager's secondary tiers, their jobs, submission, polling and results.

The manager and the promoter hand jobs to tiers only through ``submit``, and learn what became
of them only from ``poll``, which returns each finished job with the bookkeeping of its
submission (``Finished``). A tier that raises is never fatal: in ``submit`` the job becomes a
failed result at once, in ``lookup`` the answer is unknown, in ``poll`` the tier reports nothing
this time; each is counted in ``kvtier_tier_errors_total{where}``.

A tier can be switched off at run time (``disable``): it is then asked no lookup and given no
new job, while the jobs it already has still report through ``poll`` (their slots are released
and their bytes verified as always), so nothing is lost or left pinned.

Every job has a deadline (``deadlines``). ``check_deadlines`` finds the jobs past theirs
(counted once each in ``kvtier_tier_timeouts_total{tier,op}``); until such a job reports, its
tier is ``stalled`` for that kind of job. A switch is counted in
``kvtier_tier_disabled_total{tier,reason}``, the first ``MAX_REASON_LABELS`` distinct reasons
each under their own label.

Thread safety: none; it belongs to the manager (called under its lock). The tiers' own threads
are behind their non-blocking methods.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from itertools import count

from kvtier.core.deadlines import TierDeadlines
from kvtier.errors import KVTierError
from kvtier.keys import ChunkKey
from kvtier.telemetry.label_values import LabelValues
from kvtier.telemetry.logs import ThrottledLog
from kvtier.telemetry.metrics import ManagerMetrics
from kvtier.tiers.base import MISS, JobResult, Lookup, Op, SecondaryTier, TransferJob
from kvtier.tiers.registry import make_names_unique
from kvtier.tiers.shared.lineage import Link

log = logging.getLogger(__name__)
warn = ThrottledLog(log)

#: Distinct reasons ``kvtier_tier_disabled_total`` counts under their own label besides kvtier's
#: own; later ones are counted as ``other`` (an operator's come over the admin endpoint).
MAX_REASON_LABELS = 32
OWN_REASONS = ("manual", "admin", "promotion_p99", "ttft_p99", "itl_p99")


@dataclass(frozen=True)
class PendingJob:
    """A job handed to a tier: what it was, and who holds its slots until it reports."""

    op: Op
    tier: int
    keys: tuple[ChunkKey, ...]
    owner: Hashable = None  # the host-slot holds a store job keeps until it reports
    started: float = field(default_factory=time.monotonic)
    deadline: float = float("inf")


@dataclass(frozen=True)
class Finished:
    """A job that reported: its submission and its result."""

    job: PendingJob
    result: JobResult
    seconds: float = 0.0  # from submission to report
    late: bool = False  # ``check_deadlines`` returned it before it reported

    @property
    def succeeded(self) -> list[ChunkKey]:
        return [k for k in self.job.keys if k in self.result.succeeded]

    @property
    def failed(self) -> list[ChunkKey]:
        return [k for k in self.job.keys if k not in self.result.succeeded]


class TierSet:
    """The tiers in configured order (index = priority), and the jobs they have not reported."""

    def __init__(
        self,
        metrics: ManagerMetrics,
        chunk_bytes: int,
        deadlines: TierDeadlines | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tiers: list[SecondaryTier] = []
        self._metrics, self._chunk_bytes = metrics, chunk_bytes
        self.deadlines, self._clock = deadlines or TierDeadlines(), clock
        self._ids = count()
        self._pending: dict[int, PendingJob] = {}
        self._disabled: dict[int, str] = {}  # tier index -> why
        self._reasons = LabelValues(MAX_REASON_LABELS, OWN_REASONS)
        self._late: set[int] = set()  # ids of pending jobs past their deadline
        self._stalled: set[tuple[int, str]] = set()  # (tier, op) with a late job
        self._lookup_counters: dict[tuple[str, Lookup], Callable[[float], None]] = {}

    def add(self, tier: SecondaryTier) -> int:
        """Add ``tier`` last; its index."""
        self.tiers.append(tier)
        return len(self.tiers) - 1

    def __len__(self) -> int:
        return len(self.tiers)

    def __iter__(self) -> Iterator[SecondaryTier]:
        return iter(self.tiers)

    def __getitem__(self, index: int) -> SecondaryTier:
        return self.tiers[index]

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def num_pending_of(self, index: int) -> int:
        """Jobs tier ``index`` has not reported yet."""
        return sum(1 for job in self._pending.values() if job.tier == index)

    def chunks_in_flight(self, op: Op) -> int:
        """Chunks of the ``op`` jobs no tier has reported yet."""
        return sum(len(job.keys) for job in self._pending.values() if job.op == op)

    # -- deadlines -----------------------------------------------------------------------------
    def check_deadlines(self) -> list[PendingJob]:
        """The jobs that went past their deadline since the last call (each counted once); the
        tiers stalled by a late job are known from here on (``stalled``)."""
        now, late = self._clock(), []
        for job_id, job in self._pending.items():
            if now > job.deadline and job_id not in self._late:
                self._late.add(job_id)
                late.append(job)
                self._metrics.count("tier_timeouts", tier=self.tiers[job.tier].name, op=job.op)
        self._note_stalled()
        return late

    def _note_stalled(self) -> None:
        self._late &= set(self._pending)
        self._stalled = {(self._pending[i].tier, self._pending[i].op) for i in self._late}

    def stalled(self, index: int, op: Op) -> bool:
        """Whether tier ``index`` has an ``op`` job past its deadline that has not reported."""
        return (index, op) in self._stalled

    def bind(self) -> None:
        """Unique names, and each tier's own metrics bound to the manager's telemetry."""
        make_names_unique(self.tiers)
        for tier in self.tiers:
            tier.bind_metrics(self._metrics.tier_for(tier.name))

    # -- jobs --------------------------------------------------------------------------------
    def submit(
        self,
        index: int,
        op: Op,
        keys: list[ChunkKey],
        slots: list[int],
        owner: Hashable = None,
        links: tuple[Link, ...] = (),
    ) -> Finished | None:
        """Hand a job to tier ``index``; if the tier raises, the failed job to apply at once."""
        job = TransferJob(next(self._ids), tuple(keys), tuple(slots), links)
        started = self._clock()
        pending = PendingJob(op, index, job.keys, owner, started, started + self.deadlines.of(op))
        tier = self.tiers[index]
        try:
            (tier.submit_store if op == "store" else tier.submit_load)(job)
        except Exception as exc:
            warn.warning(f"{op}:{tier.name}", "tier %s refused a %s: %s", tier.name, op, exc)
            self._metrics.count("tier_errors", tier=tier.name, where="submit")
            failed = JobResult(job.job_id, op, frozenset(), frozenset(job.keys), str(exc))
            return self._account(Finished(pending, failed))
        self._pending[job.job_id] = pending
        return None

    def poll(self) -> tuple[list[Finished], list[tuple[int, list[ChunkKey]]]]:
        """Jobs that reported since the last poll, and the keys each tier removed."""
        finished: list[Finished] = []
        removed: list[tuple[int, list[ChunkKey]]] = []
        for index in range(len(self.tiers)):
            done, gone = self.poll_tier(index)
            finished += done
            removed.append((index, gone))
        return finished, removed

    def poll_tier(self, index: int) -> tuple[list[Finished], list[ChunkKey]]:
        """Tier ``index``'s jobs that reported since its last poll, and the keys it removed."""
        tier = self.tiers[index]
        try:
            results, gone = tier.get_finished_jobs(), tier.take_removed()
        except Exception as exc:
            warn.warning(f"poll:{tier.name}", "tier %s failed to report: %s", tier.name, exc)
            self._metrics.count("tier_errors", tier=tier.name, where="poll")
            return [], []
        return list(filter(None, (self._finish(index, r) for r in results))), list(gone)

    def _finish(self, index: int, result: JobResult) -> Finished | None:
        pending = self._pending.get(result.job_id)
        if pending is None or pending.tier != index:
            self._metrics.count("internal_errors", kind="unknown_job_result")
            return None
        del self._pending[result.job_id]
        late = result.job_id in self._late
        if late:
            self._note_stalled()
        return self._account(Finished(pending, result, late=late))

    def _account(self, finished: Finished) -> Finished:
        job, ok = finished.job, len(finished.succeeded)
        seconds = self._clock() - job.started
        name = self.tiers[job.tier].name
        nbytes = ok * self._chunk_bytes
        self._metrics.job(name, job.op, ok, len(job.keys) - ok, nbytes, seconds)
        if finished.result.integrity_failed:
            integrity = len(finished.result.integrity_failed)
            self._metrics.count("tier_integrity_failures", integrity, tier=name)
        return Finished(job, finished.result, seconds, finished.late)

    def take_removed(self, index: int) -> list[ChunkKey]:
        """Keys tier ``index`` removed since it last said (``[]`` if it raises, counted)."""
        tier = self.tiers[index]
        try:
            return list(tier.take_removed())
        except Exception as exc:
            warn.warning(f"poll:{tier.name}", "tier %s failed to report: %s", tier.name, exc)
            self._metrics.count("tier_errors", tier=tier.name, where="poll")
            return []

    def retire(self, index: int) -> SecondaryTier:
        """Replace tier ``index`` (closed by its owner) with a ``Retired`` stand-in of the same
        name, so that nothing here keeps it alive; returns the tier replaced. Its pending jobs
        are forgotten (the owner reported them or never will)."""
        tier = self.tiers[index]
        self.tiers[index] = Retired(tier.name)
        self._pending = {i: job for i, job in self._pending.items() if job.tier != index}
        self._note_stalled()
        self._disabled[index] = "retired"
        return tier

    # -- switching tiers on and off ------------------------------------------------------------
    def enabled(self, index: int) -> bool:
        return index not in self._disabled

    def switched_off(self, name: str) -> bool:
        """Whether the tier called ``name`` is switched off (``KVTierError`` if none is)."""
        return not self.enabled(self.index_of(name))

    def index_of(self, name: str) -> int:
        """The index of the tier called ``name``; ``KVTierError`` naming the tiers if none is."""
        for index, tier in enumerate(self.tiers):
            if tier.name == name:
                return index
        raise KVTierError(f"no tier named {name!r} (tiers: {', '.join(self.names()) or 'none'})")

    def switch(self, name: str, enable: bool, reason: str) -> bool:
        """Switch tier ``name`` on or off; whether that changed anything."""
        index = self.index_of(name)
        if enable == self.enabled(index):
            return False
        if enable:
            del self._disabled[index]
        else:
            self._disabled[index] = reason
            self._metrics.count("tier_disabled", tier=name, reason=self._reasons(reason))
        return True

    def split_by_state(self) -> tuple[list[str], list[str]]:
        """Names of the enabled and of the disabled tiers, each in config order."""
        names = self.names()
        enabled = [n for i, n in enumerate(names) if self.enabled(i)]
        return enabled, [n for i, n in enumerate(names) if not self.enabled(i)]

    # -- lookups -----------------------------------------------------------------------------
    def lookup(self, index: int, key: ChunkKey) -> Lookup | None:
        """Tier ``index``'s answer for ``key``, counted; ``None`` if the tier raised."""
        tier = self.tiers[index]
        try:
            answer = tier.lookup(key)
        except Exception as exc:
            warn.warning(f"lookup:{tier.name}", "tier %s lookup failed: %s", tier.name, exc)
            self._metrics.count("tier_errors", tier=tier.name, where="lookup")
            self._metrics.count("tier_lookups", tier=tier.name, result="error")
            return None
        self._lookup_counter(tier.name, answer)(1)
        return answer

    def _lookup_counter(self, name: str, answer: Lookup) -> Callable[[float], None]:
        """The ``tier_lookups`` counter of tier ``name``'s ``answer`` (made once: a lookup
        walk counts one per key)."""
        counter = self._lookup_counters.get((name, answer))
        if counter is None:
            counter = self._metrics.counter("tier_lookups", tier=name, result=answer.value)
            self._lookup_counters[name, answer] = counter
        return counter

    def names(self) -> list[str]:
        return [tier.name for tier in self.tiers]


class Retired(SecondaryTier):
    """What stands for a tier its owner has closed: asked nothing (switched off), it misses
    and refuses every job if asked anyway."""

    def __init__(self, name: str) -> None:
        self.name = name

    def lookup(self, key: ChunkKey) -> Lookup:
        return MISS

    def submit_store(self, job: TransferJob) -> None:
        raise KVTierError(f"tier {self.name} is closed")

    def submit_load(self, job: TransferJob) -> None:
        raise KVTierError(f"tier {self.name} is closed")

    def get_finished_jobs(self) -> list[JobResult]:
        return []

    def close(self) -> None:
        """Nothing to close."""
