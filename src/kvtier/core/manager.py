"""TieringManager: the engine-facing API; orchestrates the host tier and the secondary tiers.

Bookkeeping only: every method returns in microseconds and never waits on I/O. Bytes move on the
tiers' own threads; their results are collected by ``poll`` (which ``lookup`` also calls).

Write-through: ``complete_store(success=True)`` pushes the new host chunks to every secondary tier
at once, holding each host slot against eviction until every push has finished. ``lookup`` counts
the leading chunks ready in host; past the first host miss it hands over to ``Promoter``, which
promotes chunks from the tiers and answers ``RETRY`` until they land.

Observability: every decision is counted in ``self.metrics`` (Prometheus on ``metrics_port``),
and every chunk movement is a KV event (``take_events``; published on ZeroMQ with ``kv_events``).

Thread safety: call the methods from one thread (the engine's scheduler loop). They also take an
internal lock, so that a peer server (``serve``) can answer peers from its own driver thread
while the engine is idle; a call never waits on I/O, only, briefly, on that thread's ``poll``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from kvtier.config.schema import TieringConfig
from kvtier.control.retention import Priority, prefix_length
from kvtier.core.closing import CloseOnce
from kvtier.core.entry_checks import (
    check_flag,
    check_parent,
    checked_timeout,
    engine_call,
    serialized,
)
from kvtier.core.host_slots import ENGINE
from kvtier.core.links import LinkBook
from kvtier.core.parts import TierFactory, build_parts
from kvtier.core.peer_service import (
    ManagerPeerHost,
    ManagerService,
    Services,
    close_all,
    open_peer_server,
)
from kvtier.core.runtime_controls import RuntimeControls
from kvtier.core.tier_set import Finished
from kvtier.errors import ClosedError, KVTierError
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.telemetry.kv_events import EventKind, KVEvent
from kvtier.telemetry.metrics import state_gauges
from kvtier.tiers.base import Lookup, SecondaryTier

if TYPE_CHECKING:
    from collections import Counter

    from kvtier.tiers.peer.server import PeerServer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StorePlan:
    """Slots reserved by ``prepare_store``: write chunk ``keys[i]`` into ``slots[i]``."""

    keys: list[ChunkKey]
    slots: list[int]


class TieringManager(RuntimeControls):
    """Host tier plus secondary tiers behind the engine-facing API (docs/architecture.md).

    ``tiers`` replaces the tiers built from ``config.secondary_tiers``: tiers built by hand, or
    factories ``(region, identity) -> SecondaryTier`` called with this manager's region (e.g.
    fault-injecting wrappers). The manager owns and closes every tier it is given or builds.
    ``region`` is a host region to use instead of allocating one (its slots must hold a chunk).
    """

    def __init__(
        self,
        config: TieringConfig,
        identity: CacheIdentity,
        *,
        tiers: Sequence[SecondaryTier | TierFactory] | None = None,
        region: HostRegion | None = None,
    ) -> None:
        parts = build_parts(config, identity, tiers, region)
        self.config, self.identity = config, identity
        self.chunk_bytes = identity.layout.chunk_bytes
        self.region, self.host, self.runtime = parts.region, parts.host, parts.runtime
        self.metrics, self._tiers = self.runtime.metrics, self.runtime.tiers
        self.tiers = self._tiers.tiers
        self._lock, self._closed = self.runtime.lock, False
        self._close_once = CloseOnce("manager")
        self._events, self._provenance, self._slots = parts.events, parts.provenance, parts.slots
        self._retention, self._promoter = parts.retention, parts.promoter
        self._progress, self._clock, self._publisher = parts.progress, parts.clock, parts.publisher
        self._control = self.runtime.control
        self._write_throughs = parts.write_throughs
        self._links = LinkBook(2 * self.region.num_slots)
        self._services = Services(self.metrics)
        self._peer_host = ManagerPeerHost(self)
        self.peer_server: PeerServer | None = None
        try:
            self._start_services()
        except BaseException:
            self.close(timeout=0)
            raise

    def _start_services(self) -> None:
        """Threads that read or drive the manager: started last, once it is fully built."""
        self.runtime.serve(state_gauges(self.host), admin_target=self)
        if self.config.serve is not None:
            self.peer_server = open_peer_server(self.config.serve, self.region, self.identity)
            self.add_service(self.peer_server)
            self.peer_server.drive(self._drive)

    # -- store -------------------------------------------------------------------------------
    @engine_call
    def prepare_store(
        self,
        keys: Sequence[ChunkKey],
        *,
        priority: Priority = None,
        duration_s: float | None = None,
        first_chunk: int = 0,
        parent: ChunkKey | None = None,
        operator: bool = False,
    ) -> StorePlan | None:
        """Reserve host slots for the keys not in host and admitted; ``None`` if none can be freed.

        ``priority`` (0-100, one for all keys or one per key) orders eviction, lower first, for
        ``duration_s`` s or for good (``operator``: see ``touch``); ``first_chunk`` numbers
        ``keys[0]`` in its prefix (for ``min_prefix_chunks``) and ``parent`` is the key before
        it (``None``: ``keys`` start the prefix, or it is not known); tiers write both with the
        chunks and evict a prefix from its tail. Admission's drops are left out.
        """
        check_parent("prepare_store", parent)
        check_flag("prepare_store", "operator", operator)
        asked = self._retention.asked(keys, priority, duration_s, operator, self.runtime)
        wanted, prefix = asked.by_key(keys), prefix_length(first_chunk, keys)
        offered = [k for k in wanted if k not in self.host]
        new = self._retention.plan_store(offered, prefix, [wanted[k] for k in offered])
        slots = self._slots.allocate(new, [k for k in keys if self.host.is_ready(k)])
        if slots is None:
            self.metrics.count("store_rejected")
            return None
        self._retention.reserved(new, [wanted[k] for k in new], asked)
        self._links.record(keys, first_chunk, parent)
        self._clock.start(new)
        return StorePlan(new, slots)

    @engine_call
    def complete_store(self, keys: Sequence[ChunkKey], success: bool = True) -> None:
        """The engine finished copying ``keys`` into their slots (or failed to).

        Only keys ``prepare_store`` reserved and not yet completed count, each once.
        ``success`` is ``True`` or ``False`` (``InvalidArgumentError`` otherwise, nothing done).
        """
        check_flag("complete_store", "success", success)
        own = [k for k in dict.fromkeys(keys) if self.host.writer_of(k) == ENGINE]
        self.host.complete_write(own, success)
        self._clock.stop("accelerator_to_host", own)
        if not success:
            self.metrics.count("store_failed_chunks", len(own))
            self._retention.failed(own)
            return
        self.metrics.count("stored_chunks", len(own))
        self._events.add(EventKind.STORED, own, "accelerator", "host")
        self._provenance.stored(own)
        names = self._tiers.names() if own else []
        for index, chosen in enumerate(self._retention.for_tiers(own, names)):
            if chosen and self._tiers.enabled(index) and self.tiers[index].accepts_stores:
                self._write_through(index, chosen)

    def _write_through(self, index: int, keys: list[ChunkKey]) -> None:
        refused = self._write_throughs.start(index, keys, self._links.links_of(keys))
        if refused is not None:
            self._route(refused)

    # -- load --------------------------------------------------------------------------------
    @engine_call
    def lookup(self, keys: Sequence[ChunkKey]) -> int | Lookup:
        """How many leading ``keys`` are ready in host, or ``RETRY`` while promotions run.

        For a layout that resumes from a trailing window (``layout.window_chunks``, sliding and
        state layers only), the answer ``n`` is the prefix that can be resumed: only its chunks
        from ``layout.resume_start(n)`` on are ready in host, and only those need loading.
        After ``RETRY``, ``wait_progress`` waits for a reason to ask again.
        """
        self._progress.arm()
        self._poll()
        self.metrics.count("lookups")
        return self._promoter.lookup(keys, self.identity.layout.window_chunks)

    def wait_progress(self, timeout: float) -> bool:
        """After ``lookup`` answered ``RETRY``: wait up to ``timeout`` s for a tier to report
        progress since, then look up again; whether a tier did (``kvtier.core.progress``).

        Takes no lock (tiers and a peer server's driver thread go on meanwhile); any thread.
        ``InvalidArgumentError`` unless ``timeout`` is a number (not NaN).
        """
        seconds = checked_timeout("wait_progress", timeout)
        return self._progress.wait(math.inf if seconds is None else seconds)

    @engine_call
    def prefetch(self, keys: Sequence[ChunkKey]) -> None:
        """Start promoting the chunks of a prefix a request soon to come will look up, and
        return at once (``Promoter.prefetch``): its ``lookup`` then finds them in host, or on
        their way. Counts no lookup and no miss; what does not fit in host is left where it is.
        """
        self._poll()
        self._promoter.prefetch(keys, self.identity.layout.window_chunks)

    @engine_call
    def promote_for_peer(self, keys: Sequence[ChunkKey]) -> set[ChunkKey]:
        """For a peer server: the keys on their way to host (``Promoter.promote_for_peer``)."""
        return self._promoter.promote_for_peer(keys)

    @engine_call
    def prepare_load(
        self, keys: Sequence[ChunkKey], sources: Counter[str] | None = None
    ) -> list[int]:
        """Pin ready chunks for reading; returns their slots. Every key must be ready.

        With ``sources`` each chunk is also counted there by where it came from: ``host``, or
        the name of the tier that promoted it (as ``prompt_tokens`` counts it).
        """
        missing = self.host.not_ready(keys)
        if missing:
            raise KVTierError(f"prepare_load: {len(missing)} chunk(s) not ready in host memory")
        self._provenance.count_loaded(keys, sources)
        self._retention.used(keys)
        self._clock.start(keys)
        self.host.touch(keys)
        return self.host.hold(keys, ENGINE)

    @engine_call
    def complete_load(self, keys: Sequence[ChunkKey]) -> None:
        """The engine finished copying out of the slots ``prepare_load`` pinned.

        Every key must have been pinned by ``prepare_load`` and not yet completed: otherwise
        ``HoldError`` is raised and nothing changes (a stray release could let a slot be reused
        while a tier still reads it).
        """
        self.host.release(keys, ENGINE)
        self._clock.stop("host_to_accelerator", keys)
        self._events.add(EventKind.LOADED, keys, "host", "accelerator")

    @engine_call
    def touch(
        self,
        keys: Sequence[ChunkKey],
        *,
        hit: bool = True,
        priority: Priority = None,
        duration_s: float | None = None,
        operator: bool = False,
    ) -> None:
        """Recency for chunks the engine hit in its own accelerator cache (counted as such).

        ``hit=False``: recency only, e.g. to order a sequence's chunks for eviction; under ARC
        it is not a use, so chunks stored once stay in ARC's once-seen list.
        ``priority``/``duration_s``: a new retention priority for the chunks in host memory: a
        request's (capped), or the ``operator``'s (``HostRetention.retain_each``).
        """
        check_flag("touch", "hit", hit)
        check_flag("touch", "operator", operator)
        asked = self._retention.asked(keys, priority, duration_s, operator, self.runtime)
        if hit:
            self._provenance.count_accelerator_hits(len(keys))
            self._retention.used(keys)
        self.host.touch(keys, use=hit)
        if priority is not None or operator:
            self._retention.retain_each(keys, asked.priorities, asked)

    # -- background progress -----------------------------------------------------------------
    @serialized
    def add_service(self, service: ManagerService) -> None:
        """Run ``service.step(self)`` at every ``poll``; the manager closes it on ``close``."""
        if self._closed:
            raise ClosedError("add_service: the manager is closed")
        self._services.add(service)

    @serialized
    def poll(self) -> int:
        """Collect finished tier jobs, step the services, publish events; returns jobs seen."""
        if self._closed:
            raise ClosedError("poll: the manager is closed")
        return self._poll()

    def _drive(self) -> None:
        """A peer server's driver thread: poll while the engine is idle, until closed."""
        with self._lock:
            if not self._closed:
                self._poll()

    def _poll(self) -> int:
        self._services.step(self._peer_host)
        self._control.step()
        finished, removed = self._tiers.poll()
        for job in finished:
            self._route(job)
        for index, keys in removed:
            tier = self.tiers[index]
            self._events.add(EventKind.REMOVED, keys, tier.name, None, tier.locality)
        if self._publisher is not None:
            events = self._events.take_outbox()
            self._publisher.publish(events, self.identity.layout.tokens_per_chunk)
        return len(finished)

    def _route(self, finished: Finished) -> None:
        """A store ends its write-through holds; a load ends a promotion."""
        self._control.observe(finished)
        if finished.job.op == "load":
            self._promoter.finish(finished)
        else:
            self._write_throughs.finish(finished)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Poll until no job is pending; ``False`` if ``timeout`` seconds passed first.

        ``None`` waits as long as a job is pending; ``InvalidArgumentError`` for a ``timeout``
        that is not a number (or NaN, which no deadline would ever reach).
        """
        seconds = checked_timeout("wait_idle", timeout)
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            with self._lock:
                self._poll()
                if not self._tiers.num_pending:
                    return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.001)

    @property
    def num_pending_jobs(self) -> int:
        with self._lock:
            return self._tiers.num_pending

    # -- what happened ---------------------------------------------------------------------
    @serialized
    def take_events(self) -> list[KVEvent]:
        """Events since the last call, oldest first."""
        return self._events.take()

    @serialized
    def stats(self) -> dict[str, Any]:
        """A snapshot: host occupancy, every counter (``name{labels}``), and each tier's stats."""
        host = {**self.host.snapshot(), "slot_bytes": self.region.slot_bytes}
        return {"host": host, "events_dropped": self._events.dropped, **self.runtime.stats()}

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self, timeout: float = 30.0) -> None:
        """Stop the services, drain tier jobs (up to ``timeout`` s), close every tier's threads.

        Idempotent: a call while another thread closes returns once that close has finished
        (or after ``timeout`` s, logged). Afterwards the engine-facing methods raise
        ``ClosedError``. ``InvalidArgumentError`` (nothing closed) for a ``timeout`` that is not
        a number, or NaN.
        """
        seconds = checked_timeout("close", timeout)
        with self._lock:
            closing, self._closed = not self._closed, True
            if closing:
                self._close_once.claim()
                services = self._services.take()
        if not closing:
            self._close_once.wait(seconds)  # outside the lock: the first close needs it
            return
        try:
            close_all(services)  # outside the lock: a driver thread may be waiting for it
            if self.tiers and not self.wait_idle(seconds):
                log.warning("closing with %d tier jobs still pending", self._tiers.num_pending)
            self.runtime.close()
            close_all([self._publisher])
        finally:
            self._close_once.finished()

    def __enter__(self) -> TieringManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
