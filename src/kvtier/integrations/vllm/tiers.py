"""kvtier's tiers as vLLM secondary tiers (``secondary_tiers`` of ``TieringOffloadingSpec``).

``KvtierFs``, ``KvtierObj`` and ``KvtierPeer`` are kvtier's ``fs``, ``obj`` and ``p2p`` tiers;
``KvtierTier`` is any kvtier tier given as a nested ``"kvtier": {...}`` entry (``module_path``
tiers included). vLLM loads them by class name from ``module_path: "kvtier.integrations.vllm"``
and builds them with ``cls(offloading_spec=, primary_kv_view=, tier_type=,
backpressure_detector=, **rest_of_the_entry)``.

How the contract of vLLM's ``SecondaryTierManager`` is met:

* every method runs on vLLM's scheduler thread and returns at once: ``lookup`` and ``submit_*``
  only hand work to the kvtier tier, whose own threads move the bytes;
* jobs read and write vLLM's primary rows in place (``PrimaryRegion``): slot = chunk id;
* every submitted job is reported exactly once by ``get_finished_jobs``, failed ones too (a
  tier that raises in ``submit_*`` yields a failed result on the next poll); a promotion that
  loaded some keys reports them in ``successful_keys``; ``drain_jobs`` blocks until nothing is
  in flight;
* keys: ``KeyMap`` (``identity``); the identity comes from ``offloading_spec.config``;
* admission (``admission``): ``secondary_min_priority: P`` (0-100, default 0) skips the chunks
  whose retention priority in the storing request (``kvtier_retention``, see ``retention``; 35
  when it gives none) is below ``P``; ``admission: {...}`` applies kvtier's admission rules to
  the chunks offered (``admission``). Skipped chunks are counted in
  ``admission_dropped_<reason>``. vLLM's results have no "skipped" outcome, so a store is
  reported done with the bytes of the chunks written: vLLM keeps no record of what a secondary
  tier holds, and a later lookup of a skipped chunk is a miss;
* the backpressure detector is handed to vLLM's base class, where vLLM's manager consults it
  before each store and feeds it each store's time and bytes (as for vLLM's own fs tier);
* ``get_stats`` reports the tier's counters (``metrics``); ``take_events`` reports chunks the
  tier removed (and, with ``enable_kv_events``, chunks it stored) when vLLM publishes KV events.
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

from kvtier.config import TierConfig
from kvtier.integrations.vllm.admission import TierAdmission, admission_config
from kvtier.integrations.vllm.identity import REVERSE_CAPACITY, KeyMap, identity_from_config
from kvtier.integrations.vllm.metrics import CounterBridge, definitions, tier_label
from kvtier.integrations.vllm.options import adapter_options, fit_to_region, tier_config
from kvtier.integrations.vllm.region import PrimaryRegion
from kvtier.integrations.vllm.retention import invalid_requests, retention_by_key
from kvtier.keys import ChunkKey
from kvtier.logs import ThrottledLog
from kvtier.policies.priority import DEFAULT_PRIORITY
from kvtier.tiers import base as kv
from kvtier.tiers.registry import build_tier

log = logging.getLogger(__name__)
warn = ThrottledLog(log)

_ANSWERS = {kv.HIT: LookupResult.HIT, kv.MISS: LookupResult.MISS, kv.RETRY: LookupResult.RETRY}
_DRAIN_POLL_S = 0.001
_Row = tuple[bytes, ChunkKey, int]  # a job's chunk: vLLM's key, ours, its primary row


@dataclass(frozen=True)
class _Job:
    """A job handed to the kvtier tier: vLLM's keys and ours, in the same order."""

    offload_keys: tuple[bytes, ...]
    chunk_keys: tuple[ChunkKey, ...]
    is_promotion: bool
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
        floor = int(own.get("secondary_min_priority", 0))
        self._admission = TierAdmission(admission_config(own.get("admission"), tier_type), floor)
        locality = own.get("locality", self.default_locality)
        self.locality = Locality(str(locality).upper()) if locality else None
        self._config = tier_config(self.kind, rest, tier_type)
        self._region = PrimaryRegion(primary_kv_view)
        identity = identity_from_config(offloading_spec.config, own.get("revision", ""))
        events_on = bool(offloading_spec.kv_events_config.enable_kv_cache_events)
        self.identity, self._keys = identity, KeyMap(identity, REVERSE_CAPACITY if events_on else 0)
        self._chunk_tokens = identity.layout.block_size * identity.layout.blocks_per_chunk
        self._tier = self._start(fit_to_region(self._config, self._region), identity)
        entries = getattr(offloading_spec, "secondary_tier_configs", [])
        self._counters = CounterBridge(tier_label(entries, tier_type, options))
        self._init_state(offloading_spec, own)

    def _start(self, config: TierConfig, identity: Any) -> kv.SecondaryTier:
        try:
            return build_tier(config, self._region, identity)
        except BaseException:
            self._region.release()
            raise

    def _init_state(self, offloading_spec: Any, own: dict[str, Any]) -> None:
        events_on = bool(offloading_spec.kv_events_config.enable_kv_cache_events)
        self._events: list[OffloadingEvent] | None = [] if events_on else None
        self._store_events = events_on and bool(own.get("enable_kv_events", False))
        self._jobs: dict[int, _Job] = {}
        self._ready: list[kv.JobResult] = []
        self._own_counts: dict[str, int] = {}
        self._closed = False

    # -- lookups ---------------------------------------------------------------------------
    def lookup(self, key: Any, req_context: Any) -> LookupResult:
        """HIT, MISS or RETRY from the kvtier tier; a tier that raises is a MISS."""
        try:
            return _ANSWERS[self._tier.lookup(self._keys.chunk_key(key))]
        except Exception as exc:
            self._count("lookup_errors")
            warn.warning("lookup", "%s: lookup failed: %s", self.tier_type, exc)
            return LookupResult.MISS

    def on_new_request(self, req_context: Any) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    # -- jobs ------------------------------------------------------------------------------
    def submit_store(self, job_metadata: Any) -> None:
        """Write the job's primary rows to the tier (in its threads)."""
        self._submit(job_metadata, promotion=False)

    def submit_load(self, job_metadata: Any) -> None:
        """Read the job's chunks into its primary rows (in the tier's threads)."""
        self._submit(job_metadata, promotion=True)

    def _submit(self, job_metadata: Any, promotion: bool) -> None:
        offload = [bytes(k) for k in job_metadata.keys]
        pairs = zip(offload, self._keys.chunk_keys(offload), job_metadata.chunk_ids, strict=True)
        rows = [(key, chunk, int(slot)) for key, chunk, slot in pairs]
        if not promotion and self._admission.active:
            rows = self._admitted(rows, job_metadata.req_context)
        offload_keys = tuple(row[0] for row in rows)
        chunk_keys = tuple(row[1] for row in rows)
        slots = tuple(row[2] for row in rows)
        job_id = int(job_metadata.job_id)
        self._jobs[job_id] = _Job(offload_keys, chunk_keys, promotion, job_metadata.submit_time)
        op: kv.Op = "load" if promotion else "store"
        if not rows:  # every chunk skipped: stored nowhere, nothing to wait for
            self._ready.append(kv.JobResult(job_id, op, frozenset(), frozenset(), None))
            return
        try:
            job = kv.TransferJob(job_id, chunk_keys, slots)
            (self._tier.submit_load if promotion else self._tier.submit_store)(job)
        except Exception as exc:
            self._count("submit_errors")
            warn.warning("submit", "%s: %s job %d failed: %s", self.tier_type, op, job_id, exc)
            self._ready.append(
                kv.JobResult(job_id, op, frozenset(), frozenset(chunk_keys), str(exc))
            )

    def _admitted(self, rows: list[_Row], req_context: Any) -> list[_Row]:
        """The rows the tier's admission keeps (the others counted by reason)."""
        retention_of = retention_by_key(req_context)

        def priority(key: bytes) -> int:
            retention = retention_of(key) if retention_of is not None else None
            return retention.priority if retention is not None else DEFAULT_PRIORITY

        ends = [req_context.get_offload_key_position(row[0]) or 0 for row in rows]
        prefix = -(-max(ends, default=0) // self._chunk_tokens)
        priorities = [priority(row[0]) for row in rows]
        chunks = [row[1] for row in rows]
        reasons = self._admission.reasons(chunks, priorities, [prefix] * len(rows))
        for reason in filter(None, reasons):
            self._count(f"admission_dropped_{reason}")
        return [row for row, reason in zip(rows, reasons, strict=True) if reason is None]

    def get_finished_jobs(self) -> Iterable[JobResult]:
        """vLLM results of every job the tier finished since the last call (each once)."""
        finished, self._ready = self._ready + self._poll(), []
        self._collect_removals()
        return [r for r in (self._result(f) for f in finished) if r is not None]

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def _poll(self) -> list[kv.JobResult]:
        try:
            return list(self._tier.get_finished_jobs())
        except Exception as exc:
            warn.warning("poll", "%s: get_finished_jobs failed: %s", self.tier_type, exc)
            return []

    def _result(self, finished: kv.JobResult) -> JobResult | None:
        job = self._jobs.pop(finished.job_id, None)
        if job is None:
            return None
        succeeded = [
            ok
            for ok, ck in zip(job.offload_keys, job.chunk_keys, strict=True)
            if ck in finished.succeeded
        ]
        success = len(succeeded) == len(job.offload_keys)
        self._account(job, finished, succeeded, success)
        partial = tuple(succeeded) if job.is_promotion and succeeded and not success else None
        return JobResult(
            job_id=finished.job_id,
            success=success,
            successful_keys=partial,
            transfer_time=time.monotonic() - job.submit_time,
            transfer_bytes=len(succeeded) * self.block_size_bytes,
        )

    def _account(self, job: _Job, finished: kv.JobResult, succeeded: list[bytes], ok: bool) -> None:
        op = "load" if job.is_promotion else "store"
        self._count(f"{op}_chunks_ok", len(succeeded))
        self._count(f"{op}_chunks_failed", len(job.offload_keys) - len(succeeded))
        self._count(f"{op}_jobs_failed", 0 if ok else 1)
        self._count("integrity_failed_chunks", len(finished.integrity_failed))
        if self._store_events and not job.is_promotion and succeeded:
            self._event(list(succeeded), removed=False)

    def drain_jobs(self) -> None:
        """Block until every submitted job has finished; results stay queued for the next poll."""
        while any(job_id not in {r.job_id for r in self._ready} for job_id in self._jobs):
            self._ready.extend(self._poll())
            time.sleep(_DRAIN_POLL_S)

    # -- events, metrics, shutdown ---------------------------------------------------------
    def _collect_removals(self) -> None:
        try:
            removed = self._tier.take_removed()
        except Exception:
            return
        if self._events is not None and removed:
            keys = [k for k in (self._keys.offload_key(c) for c in removed) if k is not None]
            self._count("removals_unmapped", len(removed) - len(keys))
            if keys:
                self._event(keys, removed=True)

    def _event(self, keys: list[bytes], removed: bool) -> None:
        if self._events is not None:
            event = OffloadingEvent(keys, self.medium, removed, self.locality, self.tier_type)
            self._events.append(event)

    def take_events(self) -> Iterable[OffloadingEvent]:
        self._collect_removals()
        events, self._events = self._events or [], [] if self._events is not None else None
        return events

    def _count(self, name: str, n: int = 1) -> None:
        if n:
            self._own_counts[name] = self._own_counts.get(name, 0) + n

    def counters(self) -> dict[str, int]:
        """The tier's own counters and the adapter's (cumulative)."""
        try:
            tier_counts = dict(self._tier.stats())
        except Exception:
            tier_counts = {}
        return {
            **tier_counts,
            **self._own_counts,
            "retention_invalid_requests": invalid_requests.value,
        }

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        return definitions()

    def get_stats(self) -> Any:
        return self._counters.take_stats(self.counters())

    def shutdown(self) -> None:
        """Stop the tier (joins its threads), then drop the views of vLLM's region."""
        if self._closed:
            return
        self._closed = True
        self._tier.close()
        # Slices of vLLM's view share its buffer export, so every object that may still hold
        # one (the tier's links and finished requests, reference cycles) must be gone before
        # vLLM closes its region; calls after shutdown then fail as misses and failed jobs.
        del self._tier
        self._ready, self._jobs = [], {}
        gc.collect()
        try:
            self._region.release()
        except BufferError as exc:  # still held: vLLM's region cleanup will complain too
            log.warning("%s: primary view still in use at shutdown: %s", self.tier_type, exc)


class KvtierFs(KvtierSecondaryTier):
    """kvtier's filesystem tier: ``root_dir``, ``max_bytes``, ``o_direct``, ... (FsTierConfig)."""

    kind = "fs"
    medium = Medium.STORAGE
    cache_hit_source = CacheHitSource.DISK


class KvtierObj(KvtierSecondaryTier):
    """kvtier's S3 object tier: ``bucket``, ``endpoint_override``, ... (``ObjTierConfig``)."""

    kind = "obj"
    medium = Medium.STORAGE
    cache_hit_source = CacheHitSource.DISK
    default_locality = "REMOTE"


class KvtierPeer(KvtierSecondaryTier):
    """kvtier's peer tier: ``host`` + ``port`` or ``peers``, ... (``P2PTierConfig``)."""

    kind = "p2p"
    medium = Medium.CPU
    cache_hit_source = CacheHitSource.P2P
    default_locality = "REMOTE"


class KvtierTier(KvtierSecondaryTier):
    """Any kvtier tier, given whole as ``"kvtier": {"type": ..., ...}`` (``module_path`` too)."""

    kind = None
    medium = Medium.STORAGE
    cache_hit_source = CacheHitSource.EXTERNAL_UNSPECIFIED
