"""ObjectStoreTier (``type: "obj"``): chunks as objects in an S3-compatible bucket.

Every instance that points at the same bucket, prefix and cache identity shares the chunks. Objects
are named ``<prefix>/<identity digest hex>/<key hex>``, next to ``identity.json`` (the identity's
readable description), and hold the on-media format of ``shared/codec.py``: a 4096-byte header,
then the payload. With ``integrity_key_file`` each object is sealed with a keyed tag, and with
``encrypt`` its payload is encrypted (``shared/sealing.py``): an object that whoever can write
the bucket planted is a miss counted as ``integrity.forged``. A load streams the object's body
from the client's receive buffers into a small header buffer and straight on into the host slot
(obstore cannot read into a caller's buffer, so this one copy is the least there is), then
verifies header, identity, key, length and checksum or tag (decrypting in the slot) before the
key is reported as loaded. A store copies the slot once into a per-thread staging buffer behind
its header (encrypting on the way with ``encrypt``) and puts it in one request.

Lookups never block: an unknown key answers ``RETRY`` and is probed (HEAD) on a background pool;
all keys of one manager lookup go out together. Hits are remembered (bounded, most recent kept);
misses expire after ``negative_ttl_s`` so chunks stored by other instances become visible.

Bounded (``max_bytes``, ``max_age_s``): an ``ObjectBound`` (``bound.py``) indexes what this tier
stores, loads and finds, in the prefix-aware LRU order of ``tiers.shared.chunk_index``, and
deletes objects on the I/O pool to stay within the bound; deleted keys go to ``take_removed``.
The ``Upkeep`` thread (``upkeep.py``) rebuilds the index at start from a paged listing of the
namespace (``listing.py``; foreign names are ignored, never deleted), then expires objects
unused for ``max_age_s`` and retries failed deletes. Unbounded, the tier deletes nothing.

Outages: each request is bounded by ``timeout_s``. ``circuit_failures`` consecutive request
failures open a ``CircuitBreaker``: lookups answer ``MISS`` at once, stores are dropped and
counted, queued loads fail fast. Probes with backoff (``reconnect_min_s`` .. ``reconnect_max_s``)
close it when the store answers again; an endpoint that is down at start is the same, from the
start. Wrong credentials or a missing bucket at start raise ``TierError`` naming the problem.

Thread safety: ``lookup``, ``submit_*`` and ``take_removed`` are called from the manager's thread;
requests and deletes run on the tier's pools, the listing and sweeps on the upkeep thread;
``_known``, ``_bound`` and ``_counters`` (a ``Counters``) have their own locks.
"""

from __future__ import annotations

import json
import logging
import queue
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kvtier.errors import CapacityError, ConfigError, IntegrityError, TierError, TierUnavailable
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import (
    HIT,
    MISS,
    RETRY,
    JobResult,
    Lookup,
    Op,
    SecondaryTier,
    TransferJob,
    job_result,
)
from kvtier.tiers.s3.bodies import ObjectBodies
from kvtier.tiers.s3.bound import ObjectBound
from kvtier.tiers.s3.client import ObjectClient, ObjectRefused
from kvtier.tiers.s3.config import ObjTierConfig
from kvtier.tiers.s3.listing import NamespaceListing
from kvtier.tiers.s3.tracker import JobTracker, Outcome
from kvtier.tiers.s3.upkeep import Upkeep
from kvtier.tiers.shared import codec
from kvtier.tiers.shared.answers import Answers
from kvtier.tiers.shared.circuit import CircuitBreaker
from kvtier.tiers.shared.counters import Counters
from kvtier.tiers.shared.jobs import drain
from kvtier.tiers.shared.lineage import read_link
from kvtier.tiers.shared.sealing import make_sealer

log = logging.getLogger(__name__)

MAX_PROBE_THREADS = 8


_KeyFn = Callable[[JobTracker, int], Outcome]
#: ``fault_hook(op, key)`` runs before each delete ("delete"); it may raise ``TierError`` to
#: inject faults in tests and drills.
FaultHook = Callable[[str, ChunkKey], None]


class ObjectStoreTier(SecondaryTier):
    """Chunks in ``config.bucket``; see the module docstring for naming, lookups and outages."""

    def __init__(self, config: ObjTierConfig, region: HostRegion, identity: CacheIdentity) -> None:
        #: The size of every object of this tier: header and payload (sealed or not).
        self._object_bytes = codec.HEADER_BYTES + region.slot_bytes
        _check_room(config.max_bytes, self._object_bytes)
        self.name = config.name or "obj"
        self._region = region
        sealer = make_sealer(config.integrity_key_file, config.encrypt)
        self._bodies = ObjectBodies(sealer, identity.digest)
        prefix = "/".join(p for p in (config.prefix.strip("/"), identity.hexdigest) if p)
        self._prefix = prefix
        self._identity_doc = json.dumps(identity.describe(), indent=1, sort_keys=True).encode()
        self._client = ObjectClient(config)
        self._known = Answers(config.negative_ttl_s)
        self._counters = Counters()
        self._count = self._counters.add
        self._results: queue.SimpleQueue[JobResult] = queue.SimpleQueue()
        self._closed = False
        self._io = ThreadPoolExecutor(config.io_threads, thread_name_prefix=f"{self.name}-io")
        self._probes = ThreadPoolExecutor(
            min(MAX_PROBE_THREADS, config.io_threads), thread_name_prefix=f"{self.name}-probe"
        )
        self.fault_hook: FaultHook | None = None
        self._breaker = CircuitBreaker(
            f"obj tier (bucket {config.bucket!r} at {self._client.endpoint})",
            self._reconnect,
            failure_threshold=config.circuit_failures,
            backoff_min_s=config.reconnect_min_s,
            backoff_max_s=config.reconnect_max_s,
            on_close=self._known.clear,
        )
        self._bound, self._upkeep = self._make_bound(config, region)
        self._start()
        if self._upkeep is not None:
            self._upkeep.start()

    def _make_bound(
        self, config: ObjTierConfig, region: HostRegion
    ) -> tuple[ObjectBound | None, Upkeep | None]:
        """The index and upkeep thread of ``max_bytes``/``max_age_s`` (none without either)."""
        if config.max_bytes is None and config.max_age_s is None:
            return None, None
        bound = ObjectBound(
            config.max_bytes, config.max_age_s, self._delete, self._submit, self._known.missing
        )
        listing = NamespaceListing(self._client, self._prefix, self._object_bytes)
        return bound, Upkeep(self.name, bound, listing, self._breaker.allow, self._count)

    def _start(self) -> None:
        try:
            self._connect()
        except ObjectRefused as exc:
            self.close()
            raise TierError(f"obj tier: {exc}") from None
        except TierUnavailable as exc:
            log.warning("obj tier starts unavailable, answering MISS until it connects: %s", exc)
            self._breaker.trip(str(exc))

    def _connect(self) -> None:
        """Prove endpoint, bucket and credentials; leave the identity description beside chunks."""
        described = f"{self._prefix}/identity.json"
        self._client.check_bucket(described)
        try:
            if not self._client.exists(described):
                self._client.put(described, memoryview(self._identity_doc))
        except ObjectRefused as exc:  # read-only credentials still serve loads
            log.info("obj tier: cannot write %s (%s)", described, exc)

    def _reconnect(self) -> None:
        try:
            self._connect()
        except ObjectRefused as exc:
            log.warning("obj tier: the store answers but refuses us: %s", exc)
            raise

    @property
    def available(self) -> bool:  # type: ignore[override]
        """False while the circuit is open (endpoint down or failing)."""
        return self._breaker.allow()

    # -- lookup ------------------------------------------------------------------------------
    def lookup(self, key: ChunkKey) -> Lookup:
        if self._closed or not self._breaker.allow():
            self._count("lookup_miss_unavailable")
            return MISS
        answer = self._known.answer(key)
        if answer is None:
            answer = self._unknown(key)
        self._count(f"lookup_{answer.value}")
        return answer

    def _unknown(self, key: ChunkKey) -> Lookup:
        """A key with no answer remembered: ``HIT`` when the bound's index holds it (stored,
        loaded or listed here), else ``RETRY`` while a probe finds out."""
        if self._bound is not None and key in self._bound.index:
            self._known.found(key)
            return HIT
        self._probes.submit(self._probe, key)
        return RETRY

    def _probe(self, key: ChunkKey) -> None:
        """HEAD ``key``'s object; one this tier was deleting meanwhile is a miss
        (``probe_raced_delete``). A store or an eviction of ``key`` during the probe is newer
        than its answer, which is then dropped (``Answers.probed``)."""
        if not self._breaker.allow():
            self._known.probed(key, found=False)
            return
        mark = self._bound.index.mark() if self._bound is not None else None
        try:
            size = self._client.size_of(self._object_name(key))
        except TierError as exc:
            self._request_failed(exc)
            self._known.probed(key, found=False)
            self._count("probe_error")
            return
        self._breaker.record_success()
        if size is not None and size != self._object_bytes:  # never loads: not indexed by it
            self._count("probe_wrong_size")
            size = None
        if size is not None and self._bound is not None and not self._bound.found(key, size, mark):
            self._count("probe_raced_delete")
            size = None
        self._known.probed(key, found=size is not None)
        self._count("probe_miss" if size is None else "probe_hit")

    # -- jobs --------------------------------------------------------------------------------
    def submit_store(self, job: TransferJob) -> None:
        if not self._breaker.allow():
            self._count("store_dropped", len(job.keys))
            self._results.put(job_result(job, "store", (), "object store unavailable"))
            return
        self._fan_out("store", job)

    def submit_load(self, job: TransferJob) -> None:
        self._fan_out("load", job)

    def get_finished_jobs(self) -> list[JobResult]:
        return drain(self._results)

    def _fan_out(self, op: Op, job: TransferJob) -> None:
        """One request per key on the I/O pool; the last key to finish reports the job."""
        if self._closed or not job.keys:
            self._results.put(job_result(job, op, (), "tier is closed" if self._closed else None))
            return
        tracker = JobTracker(job, op)
        if op == "store" and self._bound is not None:  # before any put reserves: chain order
            self._bound.index.expect(job.chain())
        one = self._put_one if op == "store" else self._get_one
        for i in range(len(job.keys)):
            self._io.submit(self._run_one, tracker, one, i)

    def _run_one(self, tracker: JobTracker, one: _KeyFn, i: int) -> None:
        try:
            outcome = one(tracker, i)
        except Exception as exc:  # a worker must report, never die silently
            log.warning("obj tier %s of one chunk failed unexpectedly: %r", tracker.op, exc)
            outcome = Outcome.FAILED
        result = tracker.record(tracker.job.keys[i], outcome)
        if result is None:
            return
        if self._bound is not None:  # puts indexed in chain order, the head most recent
            self._bound.job_done(tracker.job, tracker.op, tracker.written, result.succeeded)
            if tracker.op == "store":
                self._bound.index.forget(tracker.job.keys)
        self._results.put(result)

    def _put_one(self, tracker: JobTracker, i: int) -> Outcome:
        job = tracker.job
        key, link = job.keys[i], job.link_of(i)
        if not self._breaker.allow():
            self._count("store_dropped")
            return Outcome.FAILED
        if self._known.is_hit(key) or (self._bound is not None and key in self._bound.index):
            self._count("store_already_present")
            return Outcome.OK
        body = self._bodies.encode(key, self._region.view(job.slots[i]), link)
        skipped = self._make_room(len(body), job, i)
        if skipped is not None:
            return skipped
        try:
            self._client.put(self._object_name(key), body)
        except TierError as exc:
            self._request_failed(exc)
            self._count("store_failed")
            if self._bound is not None:
                self._bound.store_failed(len(body), key)
            return Outcome.FAILED
        self._breaker.record_success()
        self._known.found(key)
        tracker.wrote(key, len(body))
        self._counters.add_pair("store_ok", "bytes_written", len(body))
        return Outcome.OK

    def _make_room(self, nbytes: int, job: TransferJob, i: int) -> Outcome | None:
        """Reserve ``nbytes`` under ``max_bytes`` (evicting): ``None`` when reserved, else how
        the put ends without being sent: ``OK`` when room would take the chunk's own prefix
        (``store_skipped_bound``), ``FAILED`` when puts in flight alone fill the bound
        (``store_no_room``)."""
        if self._bound is None:
            return None
        try:
            link = job.link_of(i)
            parent = link.parent if link is not None else None
            if self._bound.before_store(nbytes, parent, job.keys[i]):
                return None
        except CapacityError:
            self._count("store_no_room")
            return Outcome.FAILED
        self._count("store_skipped_bound")
        return Outcome.OK

    def _get_one(self, tracker: JobTracker, i: int) -> Outcome:
        key, slot = tracker.job.keys[i], tracker.job.slots[i]
        if not self._breaker.allow():
            self._count("load_skipped_unavailable")
            return Outcome.FAILED
        header, payload = self._bodies.header_buffer(), self._region.view(slot)
        filling = self._bodies.filling(payload)
        try:
            size = self._client.get_into(self._object_name(key), (header, payload), filling)
            self._breaker.record_success()
            if size is None:
                self._known.missing(key)
                self._count("load_not_found")
                if self._bound is not None:
                    self._bound.gone(key)
                return Outcome.FAILED
            self._bodies.open(header, payload, key, size, filling)
        except IntegrityError as exc:
            return self._reject(key, exc)
        except TierError as exc:
            self._request_failed(exc)
            self._count("load_failed")
            return Outcome.FAILED
        self._known.found(key)
        if self._bound is not None:
            found = read_link(header)
            self._bound.used(key, found.parent if found else None)
        self._counters.add_pair("load_ok", "bytes_read", size)
        return Outcome.OK

    def _reject(self, key: ChunkKey, exc: IntegrityError) -> Outcome:
        log.warning("obj tier: %s failed verification (%s); a miss", self._object_name(key), exc)
        self._known.missing(key)
        if self._bound is not None:  # unindexed: a store puts it again (it is not deleted)
            self._bound.gone(key)
        self._count(f"integrity.{exc.reason}")
        return Outcome.CORRUPT

    def _request_failed(self, exc: TierError) -> None:
        kind = "refused" if isinstance(exc, ObjectRefused) else "unavailable"
        self._count(f"request_errors_{kind}")
        log.debug("obj tier request failed: %s", exc)
        self._breaker.record_failure(str(exc))

    # -- names -------------------------------------------------------------------------------
    def _object_name(self, key: ChunkKey) -> str:
        return f"{self._prefix}/{key.hex()}"

    # -- lifecycle and stats -----------------------------------------------------------------
    def close(self) -> None:
        """Stop the probes and the upkeep; finish queued requests and deletes (each bounded by
        ``timeout_s``); join all."""
        self._closed = True
        if self._upkeep is not None:
            self._upkeep.stop()
        self._breaker.close()
        self._probes.shutdown(wait=True, cancel_futures=True)
        self._io.shutdown(wait=True)

    def wait_rebuilt(self, timeout: float | None = None) -> bool:
        """Wait for the start-up listing to be indexed (``True`` at once without a bound)."""
        return self._upkeep is None or self._upkeep.rebuilt.wait(timeout)

    def take_removed(self) -> list[ChunkKey]:
        return [] if self._bound is None else self._bound.take_removed()

    # -- deletes (ObjectBound's) -------------------------------------------------------------
    def _submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (a delete) on the I/O pool; dropped once the tier is closing."""
        try:
            self._io.submit(fn)
        except RuntimeError:  # shut down: the object stays, as after a failed delete
            self._count("delete_skipped_closed")

    def _delete(self, key: ChunkKey) -> None:
        """Delete chunk ``key``'s object; ``TierUnavailable`` at once while the circuit is open."""
        if not self._breaker.allow():
            raise TierUnavailable("circuit open")
        if self.fault_hook is not None:
            self.fault_hook("delete", key)
        self._client.delete(self._object_name(key))

    def stats(self) -> dict[str, int]:
        return {
            **self._counters.snapshot(),
            "circuit_state": self._breaker.state,
            "circuit_opened": self._breaker.num_opened,
            "circuit_probes": self._breaker.num_probes,
            **self._known.sizes(),
            **(self._bound.stats() if self._bound is not None else {}),
            "rebuild_done": int(self._upkeep is not None and self._upkeep.rebuilt.is_set()),
        }

    def __repr__(self) -> str:
        return f"ObjectStoreTier(name={self.name!r}, bucket={self._client.bucket!r})"


def _check_room(max_bytes: int | None, object_bytes: int) -> None:
    if max_bytes is not None and max_bytes < object_bytes:
        raise ConfigError(f"max_bytes: {max_bytes} cannot hold one object of {object_bytes} bytes")
