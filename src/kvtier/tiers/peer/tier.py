"""PeerTier (``type: "p2p"``): chunks fetched from the host memory of other kvtier instances.

The peers run a ``PeerServer`` (``serve`` in their config). One I/O thread owns a ``PeerLink``
per peer; the manager's thread only queues commands and reads answers:

* ``lookup`` answers from remembered answers (hits expire after ``hit_ttl_s``: the peer may
  evict); an unknown key answers ``RETRY`` and joins a batch: keys asked within
  ``LOOKUP_BATCH_S`` of each other go to each peer in one LOOKUP message. A key is a hit when
  some asked peer holds it in host memory, a miss when all said no or failed; a peer that is
  bringing it in from a storage tier of its own is asked again shortly (``probes``).
* ``submit_load`` fetches each key from the peer that answered the lookup (else the hinted peer,
  else the first peer). Each payload is received straight into its host slot (one copy, out of
  the transport's buffer) and verified there against its header, the cache identity and the key
  (``sealing``: its checksum, or with ``integrity_key_file`` its tag, so a peer without the key
  cannot make us load its bytes: ``integrity.forged``) before the key is reported loaded; a
  key that fails verification is reported in ``integrity_failed`` (its slot's bytes are then
  undefined). Stored chunks are sealed with the same key.
* ``submit_store`` pushes the chunks to one peer that accepts stores, each payload frame sent
  straight out of its host slot, in STOREs of at most ``protocol.max_store_keys`` chunks.
  A store succeeds only when the peer stored every key. ``accepts_stores`` is False while no
  peer has said (in its handshake) that it accepts stores: the manager then writes nothing
  through to this tier, and a store submitted anyway fails without leaving this process.
* ``hint(keys, host, port)``: an orchestrator's guess of which instance holds a prefix. Lookups
  of those keys ask that peer only, and loads prefer it. A peer not in the config is connected
  (up to ``MAX_PEERS``) and from then on asked like the configured ones. A hint that cannot
  name a peer (a host that is not a non-empty string, a port outside 1-65535) is dropped
  (``hints_dropped_bad_address``).

A slow or dead peer costs at most ``timeout_s``: its requests then fail (misses), and it is
reconnected in the background (see ``link``).

Thread safety: ``lookup``, ``hint`` and ``submit_*`` queue commands for the I/O thread;
``_answers`` and ``_counters`` have their own locks; links are touched only by the I/O thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvtier.errors import IntegrityError
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import RETRY, JobResult, Lookup, Op, SecondaryTier, TransferJob, job_result
from kvtier.tiers.peer import protocol as proto
from kvtier.tiers.peer.config import P2PTierConfig
from kvtier.tiers.peer.curve_keys import client_keys
from kvtier.tiers.peer.link import PeerLink, PeerRequest, State
from kvtier.tiers.peer.probes import Probes
from kvtier.tiers.peer.transport import Transport
from kvtier.tiers.peer.transports import transport_for
from kvtier.tiers.shared.answers import Answers
from kvtier.tiers.shared.jobs import drain
from kvtier.tiers.shared.sealing import make_sealer

log = logging.getLogger(__name__)

LOOKUP_BATCH_S = 0.0005
MISS_TTL_S = 0.5
MAX_PEERS = 64
MAX_HINTS = 1 << 16
USABLE = (State.UP, State.CONNECTING)


@dataclass
class _Job:
    """A load or store split over peer requests; reported when ``remaining`` reaches zero."""

    job: TransferJob
    op: Op
    remaining: int = 0
    succeeded: set[ChunkKey] = field(default_factory=set)
    integrity_failed: set[ChunkKey] = field(default_factory=set)


class PeerTier(SecondaryTier):
    """Fetches from (and stores to) peer instances; see the module docstring."""

    reads_peers = True

    def __init__(
        self,
        config: P2PTierConfig,
        region: HostRegion,
        identity: CacheIdentity,
        transport: Transport | None = None,
    ) -> None:
        self.name = config.name or "p2p"
        self._region, self._digest = region, identity.digest
        self._sealer = make_sealer(config.integrity_key_file, decrypts=False)
        self._transport = transport or _client_transport(config)
        keyed = self._sealer.keyed  # a tag is checked: no checksum as payloads land
        self._settings = (identity.digest, region.slot_bytes, config.timeout_s, not keyed)
        self._answers = Answers(MISS_TTL_S, hit_ttl_s=config.hit_ttl_s)
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[JobResult] = queue.SimpleQueue()
        self._counters: Counter[str] = Counter()  # written by the I/O thread only
        self._links: dict[str, PeerLink] = {}
        self._hints: OrderedDict[ChunkKey, str] = OrderedDict()
        self._probes = Probes(self._answers, config.timeout_s)
        self._jobs: dict[int, _Job] = {}
        self._stop = threading.Event()
        self._usable, self._accepts_stores = True, False
        self._configured = [(a.host, a.port) for a in config.addresses]
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-io", daemon=True)
        self._thread.start()

    # -- manager thread ----------------------------------------------------------------------
    def lookup(self, key: ChunkKey) -> Lookup:
        answer = self._answers.answer(key)
        if answer is not None:
            return answer
        self._command("lookup", key)
        return RETRY

    def hint(self, keys: Sequence[ChunkKey], host: str, port: int) -> None:
        """Peer ``host:port`` most likely holds ``keys``: ask it (only) and prefer it to load."""
        self._command("hint", (list(keys), host, port))

    def submit_load(self, job: TransferJob) -> None:
        self._command("load", job)

    def submit_store(self, job: TransferJob) -> None:
        self._command("store", job)

    def get_finished_jobs(self) -> list[JobResult]:
        return drain(self._results)

    @property
    def available(self) -> bool:  # type: ignore[override]
        """False while no peer is up or connecting (every lookup is then a miss)."""
        return self._usable and not self._stop.is_set()

    @property
    def accepts_stores(self) -> bool:
        """Whether some peer said, in its last handshake, that it accepts stores."""
        return self._accepts_stores and not self._stop.is_set()

    def stats(self) -> dict[str, int]:
        # dict() of a Counter copies in one C call under the GIL, safe against the I/O thread
        return {**dict(self._counters), **self._answers.sizes()}

    def close(self) -> None:
        """Stop the I/O thread and join it; jobs still out, or submitted from now on, finish
        as failed."""
        self._stop.set()
        self._transport.wake()
        self._thread.join()
        self._transport.close()

    def _command(self, op: str, arg: Any) -> None:
        self._commands.put((op, arg))
        self._transport.wake()
        if self._stop.is_set():  # closed: the I/O thread may have drained its last command
            self._fail_leftovers()

    # -- I/O thread --------------------------------------------------------------------------
    def _run(self) -> None:
        for host, port in self._configured:
            self._link(host, port)
        while not self._stop.is_set():
            busy = self._probes or self._jobs or any(k.busy for k in self._links.values())
            self._transport.wait(0.005 if busy else 0.2)
            try:
                self._turn()
            except Exception:  # a bug here must be loud, and must not end the I/O thread
                self._counters["io_errors"] += 1
                log.exception("%s: unexpected error in the I/O thread", self.name)
        for link in self._links.values():
            link.close()
        self._fail_leftovers()

    def _fail_leftovers(self) -> None:
        """Jobs submitted while closing or after finish as failed, so each still reports once
        (any thread: each command is taken off the queue once)."""
        while True:
            try:
                op, arg = self._commands.get_nowait()
            except queue.Empty:
                return
            if op in ("load", "store"):
                job_op: Op = "load" if op == "load" else "store"
                self._results.put(job_result(arg, job_op, (), "tier closed"))

    def _turn(self) -> None:
        self._drain_commands()
        now = time.monotonic()
        for address, keys in self._probes.due(now).items():
            self._counters["lookup_reasks"] += len(keys)
            self._ask(address, keys)
        for link in list(self._links.values()):
            link.receive()
            link.tick(now)
        self._usable = any(k.state in USABLE for k in self._links.values())
        self._accepts_stores = any(k.accepts_stores for k in self._links.values())

    def _link(self, host: str, port: int) -> PeerLink | None:
        address = f"{host}:{port}"
        link = self._links.get(address)
        if link is None and len(self._links) < MAX_PEERS:
            link = PeerLink(
                host, port, self._transport, self._settings, self._done, self._down, self._counters
            )
            self._links[address] = link
        return link

    def _down(self, link: PeerLink) -> None:
        self._answers.forget_holder(link.address)

    def _drain_commands(self) -> None:
        lookups: list[ChunkKey] = []
        while True:
            try:
                op, arg = self._commands.get_nowait()
            except queue.Empty:
                if not lookups or self._stop.wait(LOOKUP_BATCH_S) or self._commands.empty():
                    break
                continue  # more commands came during the batch window
            if op == "lookup":
                lookups.append(arg)
            else:
                getattr(self, f"_on_{op}")(arg)
        if lookups:
            self._send_lookups(lookups)

    def _on_hint(self, arg: tuple[list[ChunkKey], str, int]) -> None:
        keys, host, port = arg
        if not _is_address(host, port):
            self._counters["hints_dropped_bad_address"] += 1
            return
        if self._link(host, port) is None:
            self._counters["hints_dropped_too_many_peers"] += 1
            return
        for key in keys:
            self._hints[key] = f"{host}:{port}"
            self._hints.move_to_end(key)
        while len(self._hints) > MAX_HINTS:
            self._hints.popitem(last=False)

    # -- lookups -----------------------------------------------------------------------------
    def _send_lookups(self, keys: list[ChunkKey]) -> None:
        per_link: dict[str, list[ChunkKey]] = {}
        for key in dict.fromkeys(keys):
            hinted = self._hints.get(key)
            targets = [hinted] if hinted in self._links else list(self._links)
            self._probes.start(key, len(targets))
            for address in targets:
                per_link.setdefault(address, []).append(key)
        self._counters["lookup_keys"] += len(keys)
        for address, batch in per_link.items():
            self._ask(address, batch)

    def _ask(self, address: str, keys: list[ChunkKey]) -> None:
        link, now = self._links.get(address), time.monotonic()
        for part in _batches(keys, proto.MAX_KEYS):
            if link is None:
                for key in part:
                    self._probes.answer(key, address, proto.MISSING, now)
                continue
            self._counters["lookup_messages"] += 1
            link.send(PeerRequest(proto.LOOKUP, part))

    # -- loads and stores --------------------------------------------------------------------
    def _on_load(self, job: TransferJob) -> None:
        per_link: dict[str, list[tuple[ChunkKey, int]]] = {}
        for key, slot in zip(job.keys, job.slots, strict=True):
            per_link.setdefault(self._source_of(key), []).append((key, slot))
        batch = proto.fetch_batch(self._region.slot_bytes)
        requests = [(a, part) for a, pairs in per_link.items() for part in _batches(pairs, batch)]
        self._start_job(_Job(job, "load", len(requests)))
        for address, part in requests:
            request = PeerRequest(proto.FETCH, [k for k, _ in part], (job.job_id, part))
            request.landing = [self._region.view(slot) for _, slot in part]
            self._send_or_fail(address, request)

    def _source_of(self, key: ChunkKey) -> str:
        holder = self._answers.holder(key) or self._hints.get(key)
        if holder in self._links:
            return holder
        return next(iter(self._links), "")

    def _on_store(self, job: TransferJob) -> None:
        target = self._store_target(job.keys[0]) if job.keys else ""
        pairs = list(zip(job.keys, job.slots, strict=True))
        parts = _batches(pairs, proto.max_store_keys(self._region.slot_bytes))
        self._start_job(_Job(job, "store", len(parts)))
        for part in parts:
            frames: list[bytes | memoryview] = []
            for key, slot in part:
                view = self._region.view(slot)
                frames += [self._sealer.seal(self._digest, key, view), view]
            keys = [key for key, _ in part]
            self._send_or_fail(target, PeerRequest(proto.STORE, keys, (job.job_id, ()), frames))

    def _store_target(self, key: ChunkKey) -> str:
        hinted = self._hints.get(key)
        if hinted in self._links:
            return hinted
        links = self._links.values()
        usable = [k for k in links if k.state is State.UP and k.accepts_stores]
        usable += [k for k in links if k.state is State.CONNECTING]
        return usable[0].address if usable else ""

    def _send_or_fail(self, address: str, request: PeerRequest) -> None:
        link = self._links.get(address)
        if link is None:
            self._counters["requests_failed_no_peer"] += 1
            self._done(None, request, None)
        else:
            link.send(request)  # a STORE for a peer that refuses stores fails there

    def _start_job(self, job: _Job) -> None:
        self._jobs[job.job.job_id] = job
        self._maybe_finish(job)

    def _done(self, link: PeerLink | None, request: PeerRequest, reply: proto.Reply | None) -> None:
        """A request to ``link`` finished: ``reply`` is its validated answer, or ``None``."""
        if request.kind == proto.LOOKUP:
            states = reply.states if reply is not None else [proto.MISSING] * len(request.keys)
            address, now = link.address if link is not None else "", time.monotonic()
            for key, state in zip(request.keys, states, strict=True):
                self._probes.answer(key, address, state, now)
            return
        job = self._jobs[request.context[0]]
        if reply is not None and request.kind == proto.FETCH:
            self._receive_chunks(job, request, reply)
        elif reply is not None and all(reply.flags):
            job.succeeded.update(request.keys)
        job.remaining -= 1
        self._maybe_finish(job)

    def _receive_chunks(self, job: _Job, request: PeerRequest, reply: Any) -> None:
        """Verify each found chunk (with the checksum taken as it landed, if it did) and keep it."""
        chunks = iter(reply.chunks)
        for (key, slot), found in zip(request.context[1], reply.flags, strict=True):
            if not found:
                continue
            header, payload = next(chunks)
            landed, checksum = request.checksums.get(id(payload), (None, None))
            in_slot = landed is payload  # received straight into its slot and checksummed there
            try:
                digest = checksum if in_slot else None
                self._sealer.open(header, payload, self._digest, key, digest)
            except IntegrityError as exc:
                self._counters[f"integrity.{exc.reason}"] += 1
                job.integrity_failed.add(key)
                continue
            if not in_slot:  # a transport that could not land it: copied, hashed twice
                self._land(payload, slot)
                self._counters["fetched_chunks_copied"] += 1
            job.succeeded.add(key)
            self._counters["fetched_chunks"] += 1

    def _land(self, payload: memoryview, slot: int) -> None:
        """Copy a verified payload into ``slot`` unless it was received there already."""
        source, target = np.frombuffer(payload, dtype=np.uint8), self._region.numpy(slot)
        if source.ctypes.data != target.ctypes.data:
            target[:] = source  # numpy copies without holding the GIL

    def _maybe_finish(self, job: _Job) -> None:
        if job.remaining > 0:
            return
        del self._jobs[job.job.job_id]
        result = job_result(job.job, job.op, job.succeeded, None, job.integrity_failed)
        self._counters[f"{job.op}_chunks_ok"] += len(result.succeeded)
        self._results.put(result)


def _client_transport(config: P2PTierConfig) -> Transport:
    curve = None
    if config.curve_secret_key_file and config.curve_server_key_file:
        curve = client_keys(config.curve_secret_key_file, config.curve_server_key_file)
    return transport_for(config.transport, client=curve)


def _is_address(host: object, port: object) -> bool:
    """Whether ``host:port`` may name a peer: a host name or address, and a TCP port."""
    return isinstance(host, str) and bool(host) and type(port) is int and 0 < port < 1 << 16


def _batches(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
