"""The SecondaryTier contract: four non-blocking methods and the job types they exchange.

A tier moves chunks between host slots and its own medium. Every method returns at once:

* ``lookup(key) -> Lookup``: ``HIT``, ``MISS``, or ``RETRY`` when the answer is not known yet
  (a background probe is under way; ask again later);
* ``submit_store(job)``: write ``job.keys`` from ``job.slots`` of the region;
* ``submit_load(job)``: read ``job.keys`` into ``job.slots``, verified before success is reported;
* ``get_finished_jobs()``: results of finished jobs, each handed out exactly once;

plus ``close()``, which drains or cancels outstanding work and joins every thread the tier owns.

Optional: a tier that sets ``signals_progress`` calls ``notify_progress()`` (from any thread)
whenever a job finishes or a ``RETRY`` answer may have become another, so that an engine waiting
on a lookup (``TieringManager.wait_progress``) wakes at once; other tiers are polled.

Error granularity: a store succeeds or fails as a whole job (``JobResult.succeeded`` is every key
or none); a load reports exactly which keys arrived intact. A key that is absent from
``succeeded`` holds undefined bytes in its slot and must never be served. A tier should not raise
from these methods; the manager still treats an exception as a failed job or a miss.
"""

from __future__ import annotations

import enum
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from kvtier.keys import ChunkKey
from kvtier.telemetry.logs import ThrottledLog
from kvtier.telemetry.metrics import Telemetry, TierMetrics
from kvtier.tiers.shared.lineage import Link

log = logging.getLogger(__name__)
warn = ThrottledLog(log)


class TierConfig(Protocol):
    """A tier entry's configuration: a registered type's dataclass (``kvtier.tiers.catalog``) or
    an ``ExternalTierConfig``. ``type_name`` is the entry's ``type``; ``name`` is what the tier
    reports under (``None``: its own)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    type_name: ClassVar[str]

    @property
    def name(self) -> str | None: ...


class Lookup(enum.Enum):
    """Answer of a lookup."""

    HIT = "hit"
    MISS = "miss"
    RETRY = "retry"


HIT, MISS, RETRY = Lookup.HIT, Lookup.MISS, Lookup.RETRY

Op = Literal["store", "load"]


@dataclass(frozen=True)
class TransferJob:
    """Move ``keys[i]`` to or from host slot ``slots[i]``.

    ``links`` (stores; empty when not known): ``links[i]`` names the chunk before ``keys[i]``
    in its prefix, for tiers to write with it and to evict by (``tiers.shared.lineage``).
    """

    job_id: int
    keys: tuple[ChunkKey, ...]
    slots: tuple[int, ...]
    links: tuple[Link, ...] = ()

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.slots):
            raise ValueError("a job needs exactly one slot per key")
        if self.links and len(self.links) != len(self.keys):
            raise ValueError("a job's links, when given, need exactly one per key")

    def link_of(self, i: int) -> Link | None:
        """The link of ``keys[i]``, ``None`` when the job carries none."""
        return self.links[i] if self.links else None

    def chain(self) -> list[tuple[ChunkKey, bytes | None]]:
        """Each key with the key before it (its link's parent; ``None`` without a link)."""
        links = [self.link_of(i) for i in range(len(self.keys))]
        return [(k, None if n is None else n.parent) for k, n in zip(self.keys, links, strict=True)]


@dataclass(frozen=True)
class JobResult:
    """Outcome of a job: the keys that succeeded; ``error`` says why the others did not.

    ``integrity_failed`` names the failed keys whose bytes were found but failed verification
    (as opposed to absent or unreadable), so the manager can count why a chunk was recomputed.
    """

    job_id: int
    op: Op
    succeeded: frozenset[ChunkKey]
    failed: frozenset[ChunkKey] = field(default_factory=frozenset)
    error: str | None = None
    integrity_failed: frozenset[ChunkKey] = field(default_factory=frozenset)

    @property
    def ok(self) -> bool:
        return not self.failed


def job_result(
    job: TransferJob,
    op: Op,
    succeeded: Iterable[ChunkKey],
    error: str | None = None,
    integrity_failed: Iterable[ChunkKey] = (),
) -> JobResult:
    """The result of ``job`` with the contract's error granularity applied.

    A store succeeds or fails as a whole (any failed key fails every key); a load reports each
    key. ``error`` defaults to a count of the failed keys when there are some; keys reported
    as ``integrity_failed`` must be among the failed ones.
    """
    keys = frozenset(job.keys)
    ok = frozenset(succeeded) & keys
    if op == "store" and ok != keys:
        ok = frozenset()
    failed = keys - ok
    if error is None and failed:
        error = f"{len(failed)} of {len(keys)} chunks failed"
    return JobResult(job.job_id, op, ok, failed, error, frozenset(integrity_failed) & failed)


@dataclass(frozen=True)
class JobOutcome:
    """What a job function may return instead of the bare succeeded keys."""

    succeeded: Iterable[ChunkKey]
    integrity_failed: Iterable[ChunkKey] = ()


class SecondaryTier(ABC):
    """A storage tier below host memory. See the module docstring for the contract.

    ``available`` is False while the tier knows it cannot serve (endpoint down, circuit open);
    the manager then counts its misses as "tier unavailable". ``reads_peers`` is True for a
    tier that reads other instances' memory (p2p): a peer server never asks it for a peer.
    """

    #: Name used in stats, metrics and events; the manager makes it unique per instance.
    name: str = "tier"
    available: bool = True
    reads_peers: bool = False
    #: True for a tier that calls ``notify_progress`` as the module docstring says.
    signals_progress: bool = False
    _metrics: TierMetrics | None = None
    _progress: Callable[[], None] | None = None

    @property
    def accepts_stores(self) -> bool:
        """False while the tier would refuse every store: the manager writes nothing to it."""
        return True

    @property
    def locality(self) -> str:
        """``remote`` when the chunks live in other instances (``reads_peers``), else ``local``."""
        return "remote" if self.reads_peers else "local"

    @property
    def metrics(self) -> TierMetrics:
        """Handle to register and update this tier's own metrics (``kvtier_tier_<name>``)."""
        if self._metrics is None:
            self._metrics = TierMetrics(Telemetry(), self.name)
        return self._metrics

    def bind_metrics(self, metrics: TierMetrics) -> None:
        """Called by the manager, before any job, with the handle its exporter reads."""
        self._metrics = metrics

    def bind_progress(self, notify: Callable[[], None]) -> None:
        """Called by the manager, before any job, with what wakes an engine waiting on it."""
        self._progress = notify

    def notify_progress(self) -> None:
        """A job finished or an answer may have changed (any thread; returns at once)."""
        if self._progress is not None:
            self._progress()

    def take_removed(self) -> list[ChunkKey]:
        """Keys this tier deleted since the last call (capacity eviction, failed verification).

        The manager reports them as KV events; a tier that never deletes keeps the default.
        """
        return []

    @abstractmethod
    def lookup(self, key: ChunkKey) -> Lookup: ...

    @abstractmethod
    def submit_store(self, job: TransferJob) -> None: ...

    @abstractmethod
    def submit_load(self, job: TransferJob) -> None: ...

    @abstractmethod
    def get_finished_jobs(self) -> list[JobResult]: ...

    @abstractmethod
    def close(self) -> None: ...

    def stats(self) -> dict[str, int]:
        """Counters of this tier (failures by reason, bytes moved, ...)."""
        return {}
