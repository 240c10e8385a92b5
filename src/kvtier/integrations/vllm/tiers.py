"""kvtier's tiers as vLLM secondary tiers (``secondary_tiers`` of ``TieringOffloadingSpec``).

``KvtierFs``, ``KvtierObj`` and ``KvtierPeer`` are kvtier's ``fs``, ``obj`` and ``p2p`` tiers;
``KvtierTier`` is any kvtier tier given as a nested ``"kvtier": {...}`` entry (``module_path``
tiers included). vLLM loads them by class name from ``module_path: "kvtier.integrations.vllm"``
and builds them with ``cls(offloading_spec=, primary_kv_view=, tier_type=,
backpressure_detector=, **rest_of_the_entry)``.

The adapter only translates: every decision is the engine's ``kvtier.core.runtime.Runtime``
(``engine``), the same object kvtier's own manager composes. Each tier joins its engine's
runtime, which holds its jobs (``TierSet``), switches it off and on (by hand through the admin
endpoint, or by the SLO guard on its promotion latency), admits what it is written
(``Admission``: the tier's ``admission`` and ``secondary_min_priority``, or the extra config's
``secondary_min_priority``) and counts everything under kvtier's metric names.

How the contract of vLLM's ``SecondaryTierManager`` is met:

* every method runs on vLLM's scheduler thread and returns at once: ``lookup`` and ``submit_*``
  only hand work to the kvtier tier, whose own threads move the bytes;
* jobs read and write vLLM's primary rows in place (``PrimaryRegion``): slot = chunk id;
* every submitted job is reported exactly once by ``get_finished_jobs``, failed ones too (a
  tier that raises in ``submit_*`` yields a failed result on the next poll); a promotion that
  loaded some keys reports them in ``successful_keys``; ``drain_jobs`` blocks until nothing is
  in flight;
* a switched-off tier answers every lookup with a miss and writes nothing: its stores are
  reported done at once with no bytes, the chunks counted in
  ``kvtier_admission_dropped_total{reason="tier_disabled"}``; its jobs in flight still report;
* chunks admission drops are counted by reason; vLLM's results have no "skipped" outcome, so a
  store is reported done with the bytes of the chunks written: vLLM keeps no record of what a
  secondary tier holds, and a later lookup of a skipped chunk is a miss;
* keys: ``KeyMap`` (``identity``); the identity comes from ``offloading_spec.config``;
* the backpressure detector is handed to vLLM's base class, where vLLM's manager consults it
  before each store and feeds it each store's time and bytes (as for vLLM's own fs tier);
* ``get_stats`` reports the runtime's counters of this tier to vLLM's metrics too (``metrics``);
  ``take_events`` reports chunks the tier removed (and, with ``enable_kv_events``, chunks it
  stored) when vLLM publishes KV events.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvtier.core.tier_set import Finished
from kvtier.integrations.vllm import engine as engines
from kvtier.integrations.vllm.identity import REVERSE_CAPACITY, KeyMap, identity_from_config
from kvtier.integrations.vllm.metrics import CounterBridge, definitions, tier_label
from kvtier.integrations.vllm.options import (
    adapter_options,
    admission_config,
    fit_to_region,
    tier_config,
)
from kvtier.integrations.vllm.region import PrimaryRegion
from kvtier.integrations.vllm.request_retention import offer_terms
from kvtier.keys import ChunkKey
from kvtier.telemetry.logs import ThrottledLog
from kvtier.tiers import base as kv
from kvtier.tiers.base import TierConfig
from kvtier.tiers.catalog import TIER_TYPES, TierType
from kvtier.tiers.registry import build_tier
from kvtier.tiers.shared.lineage import Link

log = logging.getLogger(__name__)
warn = ThrottledLog(log)

_ANSWERS = {kv.HIT: LookupResult.HIT, kv.MISS: LookupResult.MISS, kv.RETRY: LookupResult.RETRY}
_DRAIN_POLL_S = 0.001
_Row = tuple[bytes, ChunkKey, int]  # a job's chunk: vLLM's key, ours, its primary row


@dataclass(frozen=True)
class _Job:
    """vLLM's side of a job handed to the runtime (its ``owner``): vLLM's id and keys, in the
    order of the runtime job's chunk keys."""

    job_id: int
    offload_keys: tuple[bytes, ...]
    submit_time: float


class KvtierSecondaryTier(SecondaryTierManager):
    """A kvtier tier behind vLLM's ``SecondaryTierManager`` (see the module docstring).

    Subclasses set ``kind`` (the kvtier tier type the flat options describe) and vLLM's
    ``medium`` / ``cache_hit_source``; ``kind = None`` reads a nested ``kvtier`` entry.
    """

    kind: ClassVar[str | None] = None
    medium = Medium.STORAGE
    default_locality: ClassVar[str | None] = None

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        **options: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        own, rest = adapter_options(options, tier_type)
        admission = admission_config(own.get("admission"), tier_type)
        locality = own.get("locality", self.default_locality)
        self.locality = Locality(str(locality).upper()) if locality else None
        self._region = PrimaryRegion(primary_kv_view)
        identity = identity_from_config(offloading_spec.config, own.get("revision", ""))
        events_on = bool(offloading_spec.kv_events_config.enable_kv_cache_events)
        self.identity, self._keys = identity, KeyMap(identity, REVERSE_CAPACITY if events_on else 0)
        self._chunk_tokens = identity.layout.block_size * identity.layout.blocks_per_chunk
        config = fit_to_region(tier_config(self.kind, rest, tier_type), self._region)
        self._engine = self._join(offloading_spec)
        self._tier = self._start(config, identity)
        self._runtime = self._engine.runtime
        floor = own.get("secondary_min_priority")
        self._index = self._runtime.add_tier(self._tier, admission, floor)
        self._runtime.bind()
        entries = getattr(offloading_spec, "secondary_tier_configs", [])
        self._counters = CounterBridge(tier_label(entries, tier_type, options))
        self._events: list[OffloadingEvent] | None = [] if events_on else None
        self._store_events = events_on and bool(own.get("enable_kv_events", False))
        self._ready: list[JobResult] = []
        self._closed = False

    def _join(self, offloading_spec: Any) -> engines.EngineRuntime:
        try:
            return engines.join(offloading_spec, self.block_size_bytes)
        except BaseException:
            self._region.release()
            raise

    def _start(self, config: TierConfig, identity: Any) -> kv.SecondaryTier:
        try:
            return build_tier(config, self._region, identity)
        except BaseException:
            engines.leave(self._engine)
            self._region.release()
            raise

    @property
    def kvtier_name(self) -> str:
        """The tier's name in kvtier's metrics and switches (unique in its engine's runtime);
        still answered after ``shutdown``, when a retired stand-in holds the name."""
        return self._runtime.tiers[self._index].name

    # -- lookups ---------------------------------------------------------------------------
    def lookup(self, key: Any, req_context: Any) -> LookupResult:
        """HIT, MISS or RETRY from the kvtier tier; a tier that raises or is switched off is a
        MISS."""
        with self._runtime.lock:
            tiers = self._runtime.tiers
            if not tiers.enabled(self._index):
                self._runtime.metrics.count(
                    "tier_lookups", tier=self.kvtier_name, result="disabled"
                )
                return LookupResult.MISS
            answer = tiers.lookup(self._index, self._keys.chunk_key(key))
        return LookupResult.MISS if answer is None else _ANSWERS[answer]

    def on_new_request(self, req_context: Any) -> RequestOffloadingContext:
        self._engine.note_request(req_context)
        return RequestOffloadingContext()

    # -- jobs ------------------------------------------------------------------------------
    def submit_store(self, job_metadata: Any) -> None:
        """Write the job's admitted primary rows to the tier (in its threads)."""
        self._submit(job_metadata, promotion=False)

    def submit_load(self, job_metadata: Any) -> None:
        """Read the job's chunks into its primary rows (in the tier's threads)."""
        self._submit(job_metadata, promotion=True)

    def _submit(self, job_metadata: Any, promotion: bool) -> None:
        offload = [bytes(k) for k in job_metadata.keys]
        pairs = zip(offload, self._keys.chunk_keys(offload), job_metadata.chunk_ids, strict=True)
        rows = [(key, chunk, int(slot)) for key, chunk, slot in pairs]
        job = _Job(int(job_metadata.job_id), (), job_metadata.submit_time)
        with self._runtime.lock:
            if not promotion:
                rows = self._admitted(rows, job_metadata.keys, job_metadata.req_context)
            if not rows:  # every chunk skipped: stored nowhere, nothing to wait for
                self._ready.append(self._vllm_result(job, (), True))
                return
            job = _Job(job.job_id, tuple(row[0] for row in rows), job.submit_time)
            op: kv.Op = "load" if promotion else "store"
            chunks, slots = [row[1] for row in rows], [row[2] for row in rows]
            links = () if promotion else self._links(rows, job_metadata.req_context)
            refused = self._runtime.tiers.submit(self._index, op, chunks, slots, job, links)
        if refused is not None:
            self._ready.append(self._result(refused))

    def _links(self, rows: list[_Row], req_context: Any) -> tuple[Link, ...]:
        """Each stored chunk's predecessor (``lineage``): the row before it when that one ends
        a chunk earlier in the request; the first chunk of a request starts its chain."""
        position = getattr(req_context, "get_offload_key_position", None)
        if position is None:
            return ()
        ends = [int(position(row[0]) or 0) for row in rows]
        links = []
        for i, row_end in enumerate(ends):
            index = row_end // self._chunk_tokens - 1 if row_end > 0 else -1
            follows = i > 0 and ends[i - 1] == row_end - self._chunk_tokens > 0
            links.append(Link(rows[i - 1][1] if follows else None, index))
        return tuple(links)

    def _admitted(self, rows: list[_Row], keys: Any, req_context: Any) -> list[_Row]:
        """The rows the runtime's admission keeps for this tier (the others counted)."""
        runtime, name = self._runtime, self.kvtier_name
        if not runtime.tiers.enabled(self._index):
            runtime.metrics.count("admission_dropped", len(rows), tier=name, reason="tier_disabled")
            return []
        if not runtime.admission.active:
            return rows
        chunks = [row[1] for row in rows]
        # vLLM hands every tier the same keys object for one store (its cascade)
        runtime.note_offer(chunks, (id(keys), getattr(req_context, "req_id", None)))
        kept = set(runtime.admission.admit(name, self._offer(rows, chunks, req_context)))
        return [row for row in rows if row[1] in kept]

    def _offer(self, rows: list[_Row], chunks: list[ChunkKey], req_context: Any) -> Any:
        offload = [row[0] for row in rows]
        prefix, priorities = offer_terms(offload, req_context, self._chunk_tokens)
        return self._runtime.admission.offer(chunks, prefix, priorities)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        """vLLM results of every job the tier finished since the last call (each once)."""
        with self._runtime.lock:
            finished, removed = self._runtime.poll_tier(self._index)
        results, self._ready = self._ready + [self._result(f) for f in finished], []
        self._note_removed(removed)
        return results

    def has_pending_work(self) -> bool:
        with self._runtime.lock:
            return bool(self._ready) or self._runtime.tiers.num_pending_of(self._index) > 0

    def _result(self, finished: Finished) -> JobResult:
        job: _Job = finished.job.owner  # type: ignore[assignment]
        done = set(finished.succeeded)
        chunks = finished.job.keys
        succeeded = tuple(k for k, c in zip(job.offload_keys, chunks, strict=True) if c in done)
        if self._store_events and finished.job.op == "store" and succeeded:
            self._event(list(succeeded), removed=False)
        if finished.job.op == "load":  # the prompt tokens this tier served (kvtier's metric)
            self._runtime.metrics.count(
                "prompt_tokens", len(succeeded) * self._chunk_tokens, source=self.kvtier_name
            )
        return self._vllm_result(job, succeeded, finished.job.op == "load")

    def _vllm_result(self, job: _Job, succeeded: tuple[bytes, ...], promotion: bool) -> JobResult:
        success = len(succeeded) == len(job.offload_keys)
        partial = succeeded if promotion and succeeded and not success else None
        return JobResult(
            job_id=job.job_id,
            success=success,
            successful_keys=partial,
            transfer_time=time.monotonic() - job.submit_time,
            transfer_bytes=len(succeeded) * self.block_size_bytes,
        )

    def drain_jobs(self) -> None:
        """Block until every submitted job has finished; results stay queued for the next poll."""
        while True:
            with self._runtime.lock:
                finished, removed = self._runtime.poll_tier(self._index)
                self._ready += [self._result(f) for f in finished]
                self._note_removed(removed)
                if not self._runtime.tiers.num_pending_of(self._index):
                    return
            time.sleep(_DRAIN_POLL_S)

    # -- events, metrics, shutdown ---------------------------------------------------------
    def _note_removed(self, removed: list[ChunkKey]) -> None:
        if self._events is not None and removed:
            keys = [k for k in (self._keys.offload_key(c) for c in removed) if k is not None]
            self._runtime.metrics.count(
                "internal_errors", len(removed) - len(keys), kind="removal_unmapped"
            )
            if keys:
                self._event(keys, removed=True)

    def _event(self, keys: list[bytes], removed: bool) -> None:
        if self._events is not None:
            event = OffloadingEvent(keys, self.medium, removed, self.locality, self.tier_type)
            self._events.append(event)

    def take_events(self) -> Iterable[OffloadingEvent]:
        with self._runtime.lock:
            self._note_removed(self._runtime.tiers.take_removed(self._index))
        events, self._events = self._events or [], [] if self._events is not None else None
        return events

    def counters(self) -> dict[str, int]:
        """The runtime's counters of this tier (cumulative), as ``family{labels}``."""
        return self._runtime.metrics.counters_of(self.kvtier_name)

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        return definitions()

    def get_stats(self) -> Any:
        return self._counters.take_stats(self.counters())

    def shutdown(self) -> None:
        """Stop the tier (joins its threads), leave the runtime, then drop the views of vLLM's
        region."""
        if self._closed:
            return
        self._closed = True
        self._tier.close()
        with self._runtime.lock:
            self._runtime.tiers.retire(self._index)
        engines.leave(self._engine)
        # Slices of vLLM's view share its buffer export, so every object that may still hold
        # one (the tier's links and finished requests, reference cycles) must be gone before
        # vLLM closes its region; calls after shutdown then fail as misses and failed jobs.
        del self._tier
        self._ready = []
        gc.collect()
        try:
            self._region.release()
        except BufferError as exc:  # still held: vLLM's region cleanup will complain too
            log.warning("%s: primary view still in use at shutdown: %s", self.tier_type, exc)


class KvtierTier(KvtierSecondaryTier):
    """Any kvtier tier, given whole as ``"kvtier": {"type": ..., ...}`` (``module_path`` too)."""

    kind = None
    medium = Medium.STORAGE
    cache_hit_source = CacheHitSource.EXTERNAL_UNSPECIFIED


def _shim(tier_type: TierType) -> type[KvtierSecondaryTier]:
    """The vLLM class of a registered tier type, as its ``VllmShim`` describes it."""
    shim = tier_type.vllm
    assert shim is not None
    attributes = {
        "__doc__": f"kvtier's ``{tier_type.type_name}`` tier, its options flat in the entry "
        f"(``{tier_type.config_class.__name__}``).",
        "__module__": __name__,
        "__qualname__": shim.class_name,
        "kind": tier_type.type_name,
        "medium": Medium[shim.medium],
        "cache_hit_source": CacheHitSource[shim.hit_source],
        "default_locality": shim.locality,
    }
    return type(shim.class_name, (KvtierSecondaryTier,), attributes)


#: ``KvtierFs``, ``KvtierObj``, ``KvtierPeer``: one class per tier type registered with a shim.
SHIMS = {t.vllm.class_name: _shim(t) for t in TIER_TYPES.values() if t.vllm is not None}
globals().update(SHIMS)  # vLLM loads a tier as ``getattr(module, type)``; pickle finds it too
