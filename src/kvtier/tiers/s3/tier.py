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

Outages: each request is bounded by ``timeout_s``. ``circuit_failures`` consecutive request
failures open a ``CircuitBreaker``: lookups answer ``MISS`` at once, stores are dropped and
counted, queued loads fail fast. Probes with backoff (``reconnect_min_s`` .. ``reconnect_max_s``)
close it when the store answers again; an endpoint that is down at start is the same, from the
start. Wrong credentials or a missing bucket at start raise ``TierError`` naming the problem.

Thread safety: ``lookup`` and ``submit_*`` are called from the manager's thread; requests run on
the tier's pools; ``_known`` and ``_counters`` have their own locks.
"""

from __future__ import annotations

import enum
import json
import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kvtier.errors import IntegrityError, TierError, TierUnavailable
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import (
    MISS,
    RETRY,
    JobResult,
    Lookup,
    Op,
    SecondaryTier,
    TransferJob,
    job_result,
)
from kvtier.tiers.s3.client import ObjectClient, ObjectRefused
from kvtier.tiers.s3.config import ObjTierConfig
from kvtier.tiers.shared import codec
from kvtier.tiers.shared.answers import Answers
from kvtier.tiers.shared.circuit import CircuitBreaker
from kvtier.tiers.shared.jobs import drain
from kvtier.tiers.shared.sealing import make_sealer

log = logging.getLogger(__name__)

MAX_PROBE_THREADS = 8


class _Outcome(enum.Enum):
    """How one key of a job ended."""

    OK = "ok"
    FAILED = "failed"
    CORRUPT = "corrupt"  # found, but failed verification


_KeyFn = Callable[[ChunkKey, int], _Outcome]


class ObjectStoreTier(SecondaryTier):
    """Chunks in ``config.bucket``; see the module docstring for naming, lookups and outages."""

    def __init__(self, config: ObjTierConfig, region: HostRegion, identity: CacheIdentity) -> None:
        self.name = config.name or "obj"
        self._region, self._digest = region, identity.digest
        self._sealer = make_sealer(config.integrity_key_file, config.encrypt)
        prefix = "/".join(p for p in (config.prefix.strip("/"), identity.hexdigest) if p)
        self._prefix = prefix
        self._identity_doc = json.dumps(identity.describe(), indent=1, sort_keys=True).encode()
        self._client = ObjectClient(config)
        self._known = Answers(config.negative_ttl_s)
        self._counters: Counter[str] = Counter()
        self._counters_lock = threading.Lock()
        self._staging = threading.local()
        self._results: queue.SimpleQueue[JobResult] = queue.SimpleQueue()
        self._closed = False
        self._io = ThreadPoolExecutor(config.io_threads, thread_name_prefix=f"{self.name}-io")
        self._probes = ThreadPoolExecutor(
            min(MAX_PROBE_THREADS, config.io_threads), thread_name_prefix=f"{self.name}-probe"
        )
        self._breaker = CircuitBreaker(
            f"obj tier (bucket {config.bucket!r} at {self._client.endpoint})",
            self._reconnect,
            failure_threshold=config.circuit_failures,
            backoff_min_s=config.reconnect_min_s,
            backoff_max_s=config.reconnect_max_s,
            on_close=self._known.clear,
        )
        self._start()

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
            answer = RETRY
            self._probes.submit(self._probe, key)
        self._count(f"lookup_{answer.value}")
        return answer

    def _probe(self, key: ChunkKey) -> None:
        if not self._breaker.allow():
            self._known.missing(key)
            return
        try:
            found = self._client.exists(self._object_name(key))
        except TierError as exc:
            self._request_failed(exc)
            self._known.missing(key)
            self._count("probe_error")
            return
        self._breaker.record_success()
        (self._known.found if found else self._known.missing)(key)
        self._count("probe_hit" if found else "probe_miss")

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
        tracker = _JobTracker(job, op)
        one = self._put_one if op == "store" else self._get_one
        for key, slot in zip(job.keys, job.slots, strict=True):
            self._io.submit(self._run_one, tracker, one, key, slot)

    def _run_one(self, tracker: _JobTracker, one: _KeyFn, key: ChunkKey, slot: int) -> None:
        try:
            outcome = one(key, slot)
        except Exception as exc:  # a worker must report, never die silently
            log.warning("obj tier %s of one chunk failed unexpectedly: %r", tracker.op, exc)
            outcome = _Outcome.FAILED
        result = tracker.record(key, outcome)
        if result is not None:
            self._results.put(result)

    def _put_one(self, key: ChunkKey, slot: int) -> _Outcome:
        if not self._breaker.allow():
            self._count("store_dropped")
            return _Outcome.FAILED
        if self._known.is_hit(key):
            self._count("store_already_present")
            return _Outcome.OK
        body = self._encode(key, self._region.view(slot))
        try:
            self._client.put(self._object_name(key), body)
        except TierError as exc:
            self._request_failed(exc)
            self._count("store_failed")
            return _Outcome.FAILED
        self._breaker.record_success()
        self._known.found(key)
        self._count("store_ok")
        self._count("bytes_written", len(body))
        return _Outcome.OK

    def _get_one(self, key: ChunkKey, slot: int) -> _Outcome:
        if not self._breaker.allow():
            self._count("load_skipped_unavailable")
            return _Outcome.FAILED
        header, payload = self._header_buffer(), self._region.view(slot)
        try:
            size = self._client.get_into(self._object_name(key), (header, payload))
            self._breaker.record_success()
            if size is None:
                self._known.missing(key)
                self._count("load_not_found")
                return _Outcome.FAILED
            _check_length(size, len(payload))
            self._sealer.open(header, payload, self._digest, key)
        except IntegrityError as exc:
            return self._reject(key, exc)
        except TierError as exc:
            self._request_failed(exc)
            self._count("load_failed")
            return _Outcome.FAILED
        self._known.found(key)
        self._count("load_ok")
        self._count("bytes_read", size)
        return _Outcome.OK

    def _reject(self, key: ChunkKey, exc: IntegrityError) -> _Outcome:
        log.warning("obj tier: %s failed verification (%s); a miss", self._object_name(key), exc)
        self._known.missing(key)
        self._count(f"integrity.{exc.reason}")
        return _Outcome.CORRUPT

    def _request_failed(self, exc: TierError) -> None:
        kind = "refused" if isinstance(exc, ObjectRefused) else "unavailable"
        self._count(f"request_errors_{kind}")
        log.debug("obj tier request failed: %s", exc)
        self._breaker.record_failure(str(exc))

    # -- buffers and names -------------------------------------------------------------------
    def _object_name(self, key: ChunkKey) -> str:
        return f"{self._prefix}/{key.hex()}"

    def _encode(self, key: ChunkKey, payload: memoryview) -> memoryview:
        """Header + payload (or its ciphertext) in this thread's staging buffer (reused: no
        allocation per put). What is sent is what is sealed: the copy, not the slot."""
        staging = getattr(self._staging, "body", None)
        if staging is None or len(staging) != codec.HEADER_BYTES + len(payload):
            staging = self._staging.body = memoryview(bytearray(codec.HEADER_BYTES + len(payload)))
        body = staging[codec.HEADER_BYTES :]
        if self._sealer.encrypts:  # the ciphertext lands in the staging buffer: no copy first
            header = self._sealer.seal(self._digest, key, payload, body)
        else:
            body[:] = payload
            header = self._sealer.seal(self._digest, key, body)
        staging[: codec.HEADER_BYTES] = header
        return staging

    def _header_buffer(self) -> memoryview:
        header = getattr(self._staging, "header", None)
        if header is None:
            header = self._staging.header = memoryview(bytearray(codec.HEADER_BYTES))
        return header

    # -- lifecycle and stats -----------------------------------------------------------------
    def close(self) -> None:
        """Stop the probes; finish queued requests (each bounded by ``timeout_s``); join all."""
        self._closed = True
        self._breaker.close()
        self._probes.shutdown(wait=True, cancel_futures=True)
        self._io.shutdown(wait=True)

    def stats(self) -> dict[str, int]:
        with self._counters_lock:
            counters = dict(self._counters)
        return {
            **counters,
            "circuit_state": self._breaker.state,
            "circuit_opened": self._breaker.num_opened,
            "circuit_probes": self._breaker.num_probes,
            **self._known.sizes(),
        }

    def _count(self, name: str, n: int = 1) -> None:
        with self._counters_lock:
            self._counters[name] += n

    def __repr__(self) -> str:
        return f"ObjectStoreTier(name={self.name!r}, bucket={self._client.bucket!r})"


class _JobTracker:
    """Counts down the keys of one job; the last ``record`` returns the job's result."""

    def __init__(self, job: TransferJob, op: Op) -> None:
        self.job, self.op = job, op
        self._remaining = len(job.keys)
        self._ended: dict[_Outcome, list[ChunkKey]] = {outcome: [] for outcome in _Outcome}
        self._lock = threading.Lock()

    def record(self, key: ChunkKey, outcome: _Outcome) -> JobResult | None:
        with self._lock:
            self._ended[outcome].append(key)
            self._remaining -= 1
            if self._remaining:
                return None
        corrupt = self._ended[_Outcome.CORRUPT]
        ok = set(self._ended[_Outcome.OK]).difference(self._ended[_Outcome.FAILED], corrupt)
        return job_result(self.job, self.op, ok, None, corrupt)


def _check_length(size: int, payload_len: int) -> None:
    if size != codec.HEADER_BYTES + payload_len:
        raise IntegrityError(
            f"object is {size} bytes, expected {codec.HEADER_BYTES + payload_len}", "length"
        )
