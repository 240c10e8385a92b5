"""TieringManager: the engine-facing API; orchestrates the host tier and the secondary tiers.

Bookkeeping only: every method returns in microseconds and never waits on I/O. Bytes move on the
tiers' own threads; their results are collected by ``poll`` (which ``lookup`` also calls).

Write-through: ``complete_store(success=True)`` pushes the new host chunks to every secondary tier
at once, holding each host slot against eviction until every push has finished. ``lookup`` counts
the leading chunks ready in host; past the first host miss it asks the secondary tiers in
configured order, tells the first holder to *promote* the chunk into a reserved host slot, and
answers ``RETRY`` until the promotion lands. A chunk whose promotion failed is never asked of the
same tier again until it is stored anew, so a bad chunk costs one recompute, not a loop.

Thread safety: none. Call every method from one thread (the engine's scheduler loop).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from types import TracebackType
from typing import Any, Protocol

from kvtier.config import TieringConfig
from kvtier.errors import ConfigError, KVTierError
from kvtier.events import EventKind, EventLog, KVEvent
from kvtier.host import WRITING, HostTier
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.region import ALIGNMENT, HostRegion, round_up
from kvtier.tiers.base import HIT, RETRY, JobResult, Lookup, SecondaryTier, TransferJob
from kvtier.tiers.registry import build_tier

log = logging.getLogger(__name__)

#: How many (tier, key) promotion failures are remembered to avoid promotion loops.
MAX_REMEMBERED_FAILURES = 1 << 16


@dataclass(frozen=True)
class StorePlan:
    """Slots reserved by ``prepare_store``: write chunk ``keys[i]`` into ``slots[i]``."""

    keys: list[ChunkKey]
    slots: list[int]


class ManagerService(Protocol):
    """Work that must run on the manager's thread, e.g. a peer server reading host slots.

    ``step`` is called at every ``poll`` and must not block; ``close`` when the manager closes.
    """

    def step(self, manager: TieringManager) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class _Pending:
    op: str
    tier: int
    keys: tuple[ChunkKey, ...]


def host_slots_for(config: TieringConfig, chunk_bytes: int) -> int:
    """How many host slots ``cpu_bytes_to_use`` holds for chunks of ``chunk_bytes``."""
    num_slots = config.cpu_bytes_to_use // round_up(chunk_bytes, ALIGNMENT)
    if num_slots == 0:
        raise ConfigError(
            f"cpu_bytes_to_use: {config.cpu_bytes_to_use} bytes cannot hold one chunk "
            f"of {chunk_bytes} bytes"
        )
    return num_slots


def check_chunking(config: TieringConfig, identity: CacheIdentity) -> None:
    """The config's chunk size, when it gives one, must be the layout's."""
    layout = identity.layout
    wanted = config.blocks_per_chunk_for(layout.block_size)
    if wanted is not None and wanted != layout.blocks_per_chunk:
        key = "blocks_per_chunk" if config.blocks_per_chunk is not None else "block_size"
        raise ConfigError(
            f"{key}: the configuration asks for {wanted} engine blocks per chunk but the layout "
            f"has {layout.blocks_per_chunk} ({layout.tokens_per_chunk} tokens per chunk)"
        )


class TieringManager:
    """Host tier plus secondary tiers behind the engine-facing API of DESIGN.md.

    ``tiers`` replaces the tiers built from ``config.secondary_tiers`` (for tiers built by hand,
    e.g. fault-injecting wrappers). The manager owns and closes every tier it is given.
    """

    def __init__(
        self,
        config: TieringConfig,
        identity: CacheIdentity,
        *,
        tiers: Sequence[SecondaryTier] | None = None,
    ) -> None:
        check_chunking(config, identity)
        self.config, self.identity = config, identity
        num_slots = host_slots_for(config, identity.layout.chunk_bytes)
        self.region = HostRegion(num_slots, identity.layout.chunk_bytes)
        self.host = HostTier(num_slots, config.eviction_policy)
        self.tiers: list[SecondaryTier] = list(tiers) if tiers is not None else self._build()
        _make_names_unique(self.tiers)
        self._job_ids = count()
        self._pending: dict[int, _Pending] = {}
        self._promoting: dict[ChunkKey, int] = {}
        self._failed: OrderedDict[tuple[int, ChunkKey], None] = OrderedDict()
        self._counters: Counter[str] = Counter()
        self._events = EventLog()
        self._services: list[ManagerService] = []
        self._closed = False

    def _build(self) -> list[SecondaryTier]:
        built: list[SecondaryTier] = []
        try:
            for tier_config in self.config.secondary_tiers:
                built.append(build_tier(tier_config, self.region, self.identity))
        except BaseException:
            for tier in built:
                tier.close()
            raise
        return built

    # -- store -------------------------------------------------------------------------------
    def prepare_store(self, keys: Sequence[ChunkKey]) -> StorePlan | None:
        """Reserve host slots for the keys not already in host; ``None`` if none can be freed."""
        new = [k for k in dict.fromkeys(keys) if k not in self.host]
        slots = self._allocate(new, protect=[k for k in keys if self.host.is_ready(k)])
        if slots is None:
            self._counters["store_rejected_host_full"] += 1
            return None
        return StorePlan(new, slots)

    def complete_store(self, keys: Sequence[ChunkKey], success: bool = True) -> None:
        """The engine finished copying ``keys`` into their slots (or failed to)."""
        own = [k for k in keys if self.host.state_of(k) == WRITING and k not in self._promoting]
        self.host.complete_write(own, success)
        if not success:
            self._counters["store_failed"] += len(own)
            return
        self._counters["stored_chunks"] += len(own)
        self._events.add(EventKind.STORED, own, "accelerator", "host")
        for key in own:
            for index in range(len(self.tiers)):
                self._failed.pop((index, key), None)
        for index in range(len(self.tiers)):
            self._cascade(index, own)

    def _cascade(self, index: int, keys: list[ChunkKey]) -> None:
        if not keys:
            return
        slots = self.host.hold(keys)
        job = self._new_job("store", index, keys, slots)
        try:
            self.tiers[index].submit_store(job)
        except Exception as exc:
            log.warning("tier %s refused a store: %s", self.tiers[index].name, exc)
            self._on_result(index, _failed_result(job, "store", exc))

    # -- load --------------------------------------------------------------------------------
    def lookup(self, keys: Sequence[ChunkKey]) -> int | Lookup:
        """How many leading ``keys`` are ready in host, or ``RETRY`` while promotions run."""
        self.poll()
        is_ready = self.host.is_ready
        ready = 0
        for key in keys:
            if not is_ready(key):
                break
            ready += 1
        self._counters["lookups"] += 1
        if ready == len(keys):
            return ready
        return self._lookup_beyond(keys, ready)

    def _lookup_beyond(self, keys: Sequence[ChunkKey], ready: int) -> int | Lookup:
        waiting, wanted = self._walk_tiers(keys[ready:])
        protect = keys[:ready]
        self.host.hold(protect)
        try:
            room = self.host.num_allocatable
            started = [self._promote(i, ks) for i, ks in _by_tier(wanted[:room]).items()]
        finally:
            self.host.release(protect)
        if waiting or any(started):
            return RETRY
        if wanted:
            self._counters["lookup_host_full"] += 1
        return ready

    def _walk_tiers(self, keys: Sequence[ChunkKey]) -> tuple[bool, list[tuple[int, ChunkKey]]]:
        """Walk keys past the ready prefix until one is held nowhere.

        Returns whether some key is on its way (promoting, or a tier answered RETRY) and, in
        prefix order, the (tier index, key) pairs to promote.
        """
        waiting = False
        wanted: list[tuple[int, ChunkKey]] = []
        for key in keys:
            state = self.host.state_of(key)
            if state is not None:
                if state == WRITING and key not in self._promoting:
                    break  # an engine store in flight: not readable yet
                waiting = waiting or state == WRITING
                continue
            holder = self._find_holder(key)
            if holder is None:
                break
            if isinstance(holder, int):
                wanted.append((holder, key))
            else:
                waiting = True
        return waiting, wanted

    def _find_holder(self, key: ChunkKey) -> int | Lookup | None:
        """Index of the first tier that holds ``key``, ``RETRY`` if one may, else ``None``."""
        maybe = False
        for index, tier in enumerate(self.tiers):
            if (index, key) in self._failed:
                continue
            try:
                answer = tier.lookup(key)
            except Exception as exc:
                log.warning("tier %s lookup failed: %s", tier.name, exc)
                self._counters[f"tier.{tier.name}.lookup_errors"] += 1
                continue
            if answer is HIT:
                return index
            maybe = maybe or answer is RETRY
        return RETRY if maybe else None

    def _promote(self, index: int, keys: list[ChunkKey]) -> bool:
        slots = self._allocate(keys, protect=[])
        if slots is None:
            return False
        job = self._new_job("load", index, keys, slots)
        for key in keys:
            self._promoting[key] = index
        try:
            self.tiers[index].submit_load(job)
        except Exception as exc:
            log.warning("tier %s refused a load: %s", self.tiers[index].name, exc)
            self._on_result(index, _failed_result(job, "load", exc))
            return False
        return True

    def prepare_load(self, keys: Sequence[ChunkKey]) -> list[int]:
        """Pin ready chunks for reading; returns their slots. Every key must be ready."""
        missing = [k for k in keys if not self.host.is_ready(k)]
        if missing:
            raise KVTierError(f"prepare_load: {len(missing)} chunk(s) not ready in host memory")
        self.host.touch(keys)
        return self.host.hold(keys)

    def complete_load(self, keys: Sequence[ChunkKey]) -> None:
        """The engine finished copying out of the slots ``prepare_load`` pinned."""
        self.host.release(keys)

    def touch(self, keys: Sequence[ChunkKey]) -> None:
        """Recency for chunks the engine used (e.g. hits in its own accelerator cache)."""
        self.host.touch(keys)

    # -- background progress -----------------------------------------------------------------
    def add_service(self, service: ManagerService) -> None:
        """Run ``service.step(self)`` at every ``poll``; the manager closes it on ``close``."""
        self._services.append(service)

    def poll(self) -> int:
        """Collect finished tier jobs and step the services; returns how many jobs finished."""
        for service in self._services:
            try:
                service.step(self)
            except Exception as exc:
                log.warning("service %r failed: %s", service, exc)
                self._counters["service_errors"] += 1
        collected = 0
        for index, tier in enumerate(self.tiers):
            try:
                results = tier.get_finished_jobs()
            except Exception as exc:
                log.warning("tier %s failed to report jobs: %s", tier.name, exc)
                self._counters[f"tier.{tier.name}.poll_errors"] += 1
                continue
            for result in results:
                self._on_result(index, result)
            collected += len(results)
        return collected

    def _on_result(self, index: int, result: JobResult) -> None:
        pending = self._pending.pop(result.job_id, None)
        if pending is None or pending.tier != index:
            self._counters["unknown_job_results"] += 1
            return
        name = self.tiers[index].name
        ok = [k for k in pending.keys if k in result.succeeded]
        bad = [k for k in pending.keys if k not in result.succeeded]
        self._counters[f"tier.{name}.{pending.op}_chunks_ok"] += len(ok)
        self._counters[f"tier.{name}.{pending.op}_chunks_failed"] += len(bad)
        if pending.op == "store":
            self.host.release(pending.keys)
            self._events.add(EventKind.WRITTEN, ok, "host", name)
        else:
            self._finish_promotion(index, ok, bad)

    def _finish_promotion(self, index: int, ok: list[ChunkKey], bad: list[ChunkKey]) -> None:
        for key in (*ok, *bad):
            del self._promoting[key]
        self.host.complete_write(ok, success=True)
        self.host.complete_write(bad, success=False)
        self._events.add(EventKind.PROMOTED, ok, self.tiers[index].name, "host")
        for key in bad:
            self._failed[(index, key)] = None
        while len(self._failed) > MAX_REMEMBERED_FAILURES:
            self._failed.popitem(last=False)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Poll until no job is pending; ``False`` if ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.poll()
            if not self._pending:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.001)

    @property
    def num_pending_jobs(self) -> int:
        return len(self._pending)

    # -- helpers -----------------------------------------------------------------------------
    def _allocate(self, keys: list[ChunkKey], protect: list[ChunkKey]) -> list[int] | None:
        """Slots for ``keys`` (state WRITING), never evicting ``protect``; ``None`` if full."""
        if not keys:
            return []
        self.host.hold(protect)
        try:
            allocation = self.host.allocate(keys)
        finally:
            self.host.release(protect)
        if allocation is None:
            return None
        slots, evicted = allocation
        self._counters["evicted_chunks"] += len(evicted)
        self._events.add(EventKind.EVICTED, evicted, "host", None)
        return slots

    def _new_job(self, op: str, index: int, keys: list[ChunkKey], slots: list[int]) -> TransferJob:
        job = TransferJob(next(self._job_ids), tuple(keys), tuple(slots))
        self._pending[job.job_id] = _Pending(op, index, job.keys)
        return job

    def take_events(self) -> list[KVEvent]:
        """Events since the last call, oldest first."""
        return self._events.take()

    def stats(self) -> dict[str, Any]:
        """A snapshot of counters: host occupancy, per-tier job outcomes, failures by reason."""
        return {
            "host": {
                "num_slots": self.host.num_slots,
                "used_slots": len(self.host),
                "free_slots": self.host.num_free,
                "held_slots": self.host.num_held,
                "slot_bytes": self.region.slot_bytes,
            },
            "counters": dict(self._counters),
            "pending_jobs": len(self._pending),
            "events_dropped": self._events.dropped,
            "tiers": {tier.name: tier.stats() for tier in self.tiers},
        }

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self, timeout: float = 30.0) -> None:
        """Drain background jobs (up to ``timeout`` s), then close every tier and its threads."""
        if self._closed:
            return
        self._closed = True
        if not self.wait_idle(timeout):
            log.warning("closing with %d tier jobs still pending", len(self._pending))
        closables: list[ManagerService | SecondaryTier] = [*self._services, *self.tiers]
        for closable in closables:
            try:
                closable.close()
            except Exception as exc:
                log.warning("%r failed to close: %s", closable, exc)
        self._services.clear()
        self.poll()

    def __enter__(self) -> TieringManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _by_tier(wanted: list[tuple[int, ChunkKey]]) -> dict[int, list[ChunkKey]]:
    groups: dict[int, list[ChunkKey]] = {}
    for index, key in wanted:
        groups.setdefault(index, []).append(key)
    return groups


def _failed_result(job: TransferJob, op: str, exc: BaseException) -> JobResult:
    return JobResult(job.job_id, op, frozenset(), frozenset(job.keys), str(exc))  # type: ignore[arg-type]


def _make_names_unique(tiers: list[SecondaryTier]) -> None:
    seen: Counter[str] = Counter(t.name for t in tiers)
    for index, tier in enumerate(tiers):
        if seen[tier.name] > 1:
            tier.name = f"{tier.name}#{index}"
