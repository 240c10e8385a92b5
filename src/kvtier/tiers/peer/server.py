"""PeerServer: answers other instances' lookups, fetches and stores out of this host tier.

A manager service (built by the manager when its config has ``serve``) that sees host memory
only through ``PeerHost`` (``host_view``). Two threads share the work so that host memory is
only ever touched on the manager's thread:

* the server thread owns the listener: it validates every message (``protocol``), shakes
  hands (protocol version and cache identity, else refused and logged), verifies stored chunks
  (with ``integrity_key_file``, their tag: a client without the key stores nothing,
  ``store_integrity.forged``), and puts work on the inbox; it encodes fetch replies (sealed
  with that key, once per slot residency: ``server_seals``) and sends each payload frame
  straight out of its host slot (zero-copy), watching the send receipt;
* ``step`` (the manager's thread, at every ``poll``) answers lookups, holds the slots of
  fetched chunks and hands their views to the server thread, reserves slots for stored chunks,
  and releases holds once their bytes are sent.

A lookup answers HELD for a chunk ready in host, COMING for one on its way there: a lookup of a
chunk that only this instance's own storage tiers hold starts its promotion
(``TieringManager.promote_for_peer``), and the client asks again. A fetch serves host-ready
chunks only. While tier jobs are pending the driver polls every ``BUSY_POLL_S``, so promotions
land while the engine is idle. Holds are per client and bounded (``server_holds``): a budget per
client (a CURVE key, or a connection without CURVE) and for all clients, and an absolute
deadline (``hold_timeout_s``). A client too slow to drain its replies then gets its slot
released while bytes may still be queued; the header's checksum (or tag) was taken while the
slot was held, so the client's verification turns any overwritten bytes into a miss. Such a
client gets no more holds until those replies are gone.

What a client may send is bounded before anything is buffered (``transport.MessageLimits``):
single-frame requests only, unless this server accepts stores (then STOREs of at most
``protocol.max_store_keys`` chunks). A server that listens beyond loopback without CURVE
logs a warning at start (``ServeConfig`` refuses ``accept_stores`` there unless forced).

Thread safety: the inbox and outbox are thread-safe queues; ``_counters`` has its own lock;
``_jobs_pending`` is written on the manager's thread and read by the driver (a stale read costs
one idle wait at most).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvtier.errors import IntegrityError
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.telemetry.logs import ThrottledLog
from kvtier.tiers.peer import protocol as proto
from kvtier.tiers.peer.config import ServeConfig
from kvtier.tiers.peer.server_holds import PeerHolds, Replies
from kvtier.tiers.peer.server_seals import ServedSeals
from kvtier.tiers.peer.server_transport import listen
from kvtier.tiers.peer.transport import Transport
from kvtier.tiers.shared.sealing import make_sealer

if TYPE_CHECKING:
    from kvtier.tiers.peer.host_view import PeerHost

log = logging.getLogger(__name__)

MAX_CLIENTS = 4096  # handshaken connections remembered; the oldest are forgotten first
MAX_MESSAGES_PER_TURN = 256
BUSY_POLL_S, IDLE_POLL_S = 0.005, 0.05


@dataclass
class _Work:
    """Inbox item for ``step``: a request to answer, or slots to complete or release."""

    op: str  # "lookup" | "fetch" | "store" | "stored" | "release" | "unstall"
    keys: list[ChunkKey]
    peer: bytes = b""
    req_id: int = 0
    payloads: list[memoryview | None] = field(default_factory=list)
    stalled: bool = False  # "release": the reply outlived its holds
    client: bytes = b""  # "fetch": whom the hold budget counts (``PeerHolds``)


@dataclass
class _Fetch:
    """A fetch reply for the server thread: ``flags`` per requested key, and the served keys
    (those flagged) with their slots and the slots' generations when served; ``held`` (a
    prefix of them) are held until the reply is sent."""

    peer: bytes
    req_id: int
    flags: list[bool]
    keys: list[ChunkKey]
    slots: list[int]
    stamps: list[int]
    held: list[ChunkKey]


class PeerServer:
    """Serves ``region``'s host tier to peers; see the module docstring."""

    def __init__(
        self,
        config: ServeConfig,
        region: HostRegion,
        identity: CacheIdentity,
        transport: Transport | None = None,
    ) -> None:
        self._config, self._region, self._digest = config, region, identity.digest
        self._sealer = make_sealer(config.integrity_key_file, decrypts=False)
        self._seals = ServedSeals(self._sealer, self._digest)
        self._transport, self._listener = listen(config, region.slot_bytes, transport)
        self._holds = PeerHolds(region.num_slots, config.hold_timeout_s)
        self._inbox: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._work_ready, self._stop = threading.Event(), threading.Event()
        self._clients: OrderedDict[bytes, bytes] = OrderedDict()  # peer id -> budget name
        self._replies = Replies()
        self._counters: Counter[str] = Counter()
        self._counters_lock = threading.Lock()
        self._warn = ThrottledLog(log)  # what a peer can repeat at will is logged sparingly
        self._driver: threading.Thread | None = None
        self._jobs_pending = False  # the manager had tier jobs out at the last step
        self._thread = threading.Thread(target=self._run, name="kvtier-peer-server", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._listener.port

    def drive(self, poll: Callable[[], object]) -> None:
        """Call ``poll`` (the manager's) from a thread of our own whenever a request waits.

        So peers are answered even while the engine is idle and polls nobody; the manager's
        lock keeps this thread and the engine's apart.
        """
        self._driver = threading.Thread(
            target=self._drive, args=(poll,), name="kvtier-peer-driver", daemon=True
        )
        self._driver.start()

    def _drive(self, poll: Callable[[], object]) -> None:
        while not self._stop.is_set():
            busy = self._jobs_pending  # a finished promotion wakes nobody: poll for it
            woken = self.wait_for_work(BUSY_POLL_S if busy else IDLE_POLL_S)
            if (woken or busy) and not self._stop.is_set():
                try:
                    poll()
                except Exception as exc:  # the driver must outlive one bad turn
                    log.warning("peer server driver: poll failed: %s", exc)

    def wait_for_work(self, timeout: float) -> bool:
        """Block until a request is waiting for ``step`` (or ``timeout``); for serve loops.

        True means: call ``step`` now; it will see every request submitted before this returned.
        """
        if not self._work_ready.wait(timeout):
            return False  # not cleared: a request submitted as the wait timed out wakes us next
        self._work_ready.clear()  # what is submitted from now on sets it again
        return True

    def stats(self) -> dict[str, int]:
        """Counters of the server, its listener and its holds; ``peer_held_slots`` now."""
        with self._counters_lock:
            counters = dict(self._counters)
        counters.update(self._listener.stats())
        counters.update(dict(self._holds.counters))
        counters["peer_held_slots"] = self._holds.held
        return counters

    def _count(self, name: str, n: int = 1) -> None:
        with self._counters_lock:
            self._counters[name] += n

    # -- manager thread ----------------------------------------------------------------------
    def step(self, host: PeerHost) -> None:
        """Answer queued requests and apply finished sends; never blocks (manager's thread)."""
        handlers = {
            "lookup": self._on_lookup,
            "fetch": self._on_fetch,
            "store": self._on_store,
            "stored": self._on_stored,
            "release": self._on_release,
            "unstall": self._on_unstall,
        }
        while True:
            try:
                work = self._inbox.get_nowait()
            except queue.Empty:
                break
            handlers[work.op](host, work)
        self._jobs_pending = host.busy

    def _on_lookup(self, host: PeerHost, work: _Work) -> None:
        held = [host.is_ready(k) for k in work.keys]
        coming = set() if all(held) else host.promote(work.keys)
        states = [
            proto.HELD if ready else proto.COMING if key in coming else proto.MISSING
            for key, ready in zip(work.keys, held, strict=True)
        ]
        self._count("lookup_keys", len(states))
        self._count("lookup_hits", sum(held))
        self._count("lookup_coming", states.count(proto.COMING))
        self._reply(work.peer, proto.encode(proto.LOOKUP, work.req_id, states))

    def _on_fetch(self, host: PeerHost, work: _Work) -> None:
        """Serve every ready key: those within the client's budget held until sent, the rest
        unpinned (a slot reused meanwhile fails the client's verification: a miss). A stalled
        client (it does not read its replies) is served nothing."""
        ready = [k for k in work.keys if host.is_ready(k)]
        host.touch(ready)
        grant = self._holds.take(host, work.peer, ready, time.monotonic(), work.client)
        served = [] if grant.refused else ready
        slots = grant.slots + [host.slot_of(k) for k in served[len(grant.keys) :]]
        flags = [not grant.refused and host.is_ready(k) for k in work.keys]
        stamps = [host.generation(slot) for slot in slots]
        reply = _Fetch(work.peer, work.req_id, flags, served, slots, stamps, grant.keys)
        self._outbox.put(("fetch", (reply, grant.deadline, host.generation)))
        self._transport.wake()

    def _on_store(self, host: PeerHost, work: _Work) -> None:
        verified = [k for k, p in zip(work.keys, work.payloads, strict=True) if p is not None]
        plan = host.reserve(verified)
        if plan is None:
            self._count("store_rejected_host_full", len(verified))
            self._reply(work.peer, proto.encode(proto.STORE, work.req_id, [False] * len(work.keys)))
            return
        planned, slots = plan
        slot_of = dict(zip(planned, slots, strict=True))
        copies = [
            (self._region.view(slot_of[k]), work.payloads[i])
            for i, k in enumerate(work.keys)
            if k in slot_of and work.payloads[i] is not None
        ]
        flags = [
            p is not None and (k in slot_of or host.is_ready(k))
            for k, p in zip(work.keys, work.payloads, strict=True)
        ]
        self._outbox.put(("store", (work.peer, work.req_id, flags, planned, copies)))
        self._transport.wake()

    def _on_stored(self, host: PeerHost, work: _Work) -> None:
        host.complete(work.keys)

    def _on_release(self, host: PeerHost, work: _Work) -> None:
        self._holds.give_back(host, work.peer, work.keys)
        if work.stalled:
            self._holds.stall(work.peer, True)

    def _on_unstall(self, host: PeerHost, work: _Work) -> None:
        self._holds.stall(work.peer, False)

    def _reply(self, peer: bytes, meta: bytes) -> None:
        self._outbox.put(("reply", (peer, [meta])))
        self._transport.wake()

    def _submit(self, work: _Work) -> None:
        self._inbox.put(work)
        self._work_ready.set()

    # -- server thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._transport.wait(0.05 if self._replies else 1.0)
            for _ in range(MAX_MESSAGES_PER_TURN):
                message = self._listener.recv()
                if message is None:
                    break
                self._guarded(self._receive, *message)
            self._guarded(self._drain_outbox)
            self._guarded(self._check_sending)

    def _guarded(self, handler: Any, *args: Any) -> None:
        """Run ``handler``; a bug in one message's handling must not stop the server."""
        try:
            handler(*args)
        except Exception:
            self._count("server_errors")
            log.exception("peer server: unexpected error (the server keeps running)")

    def _receive(self, peer: bytes, frames: list[memoryview], user: bytes | None) -> None:
        try:
            message = proto.decode_request(frames, self._region.slot_bytes)
        except proto.ProtocolError as exc:
            self._count("malformed_messages")
            log.debug("peer server: dropped a malformed message: %s", exc.reason)
            return
        if isinstance(message, proto.Hello):
            self._handshake(peer, message, user)
        elif peer not in self._clients:
            self._count("refused_no_handshake")
            refusal = proto.encode(proto.REFUSED, message.req_id, "hello first")
            self._listener.send(peer, [refusal])
        elif message.kind == proto.STORE:
            self._receive_store(peer, message)
        else:
            op = "lookup" if message.kind == proto.LOOKUP else "fetch"
            client = self._clients[peer]
            self._submit(_Work(op, list(message.keys), peer, message.req_id, client=client))

    def _handshake(self, peer: bytes, hello: proto.Hello, user: bytes | None) -> None:
        """Admit ``peer`` if its protocol and cache identity match, else refuse it (and end
        an admission it had); its holds count against its CURVE key's budget (``user``), or
        its connection's without CURVE."""
        reason = ""
        if hello.version != proto.PROTOCOL_VERSION:
            reason = f"protocol version {hello.version}, this server's is {proto.PROTOCOL_VERSION}"
        elif hello.identity != self._digest:
            reason = (
                f"cache identity {hello.identity.hex()[:16]}… differs from this server's "
                f"{self._digest.hex()[:16]}… (another model, revision or KV layout)"
            )
        if reason:  # a connection admitted before is not any more
            self._clients.pop(peer, None)
            self._count("refused_handshakes")
            self._warn.warning("refused", "peer server: refused a peer: %s", reason)
        else:
            self._clients[peer] = b"key:" + user if user else b"connection:" + peer
            self._clients.move_to_end(peer)
            while len(self._clients) > MAX_CLIENTS:
                self._clients.popitem(last=False)
        body = [not reason, self._config.accept_stores, reason]
        self._listener.send(peer, [proto.encode(proto.HELLO, hello.req_id, body)])

    def _receive_store(self, peer: bytes, request: proto.Request) -> None:
        """A STORE (only a server that accepts stores takes messages with chunk frames)."""
        payloads = [
            payload if self._verified(key, header, payload) else None
            for key, (header, payload) in zip(request.keys, request.chunks, strict=True)
        ]
        self._submit(_Work("store", list(request.keys), peer, request.req_id, payloads))

    def _verified(self, key: ChunkKey, header: memoryview, payload: memoryview) -> bool:
        try:
            self._sealer.open(header, payload, self._digest, key)
        except IntegrityError as exc:
            self._count(f"store_integrity.{exc.reason}")
            return False
        return True

    def _drain_outbox(self) -> None:
        while True:
            try:
                op, args = self._outbox.get_nowait()
            except queue.Empty:
                return
            send = self._listener.send if op == "reply" else getattr(self, f"_send_{op}")
            send(*args)

    def _send_fetch(self, fetch: _Fetch, deadline: float, generation: Callable[[int], int]) -> None:
        """Send the served chunks out of their slots, each with its header (``ServedSeals``:
        one whose slot was allocated again meanwhile is dropped, its flag cleared); the held
        ones (a prefix) are released once sent."""
        frames: list[bytes | memoryview] = []
        flags = list(fetch.flags)
        served = iter(zip(fetch.keys, fetch.slots, fetch.stamps, strict=True))
        for i, flag in enumerate(fetch.flags):
            if not flag:
                continue
            key, slot, stamp = next(served)
            view = self._region.view(slot)
            header = self._seals.header(key, view, slot, stamp, generation)
            if header is None:
                flags[i] = False
                self._count("fetch_slot_reused")
            else:
                frames += [header, view]
        meta = proto.encode(proto.FETCH, fetch.req_id, flags)
        receipt = self._listener.send(fetch.peer, [meta, *frames])
        if fetch.held:
            self._replies.add(receipt, fetch.peer, fetch.held, deadline)
        self._count("fetched_chunks", len(frames) // 2)

    def _send_store(
        self, peer: bytes, req_id: int, flags: list[bool], new_keys: list[ChunkKey], copies: Any
    ) -> None:
        for slot_view, payload in copies:
            slot_view[:] = payload
        self._submit(_Work("stored", new_keys))
        self._count("stored_chunks", len(new_keys))
        self._listener.send(peer, [proto.encode(proto.STORE, req_id, flags)])

    def _check_sending(self) -> None:
        """Release the holds of sent replies, and of replies past their deadline (stalled)."""
        sent, expired, recovered = self._replies.check(time.monotonic())
        for reply in sent:
            self._submit(_Work("release", reply.keys, reply.peer))
        for reply in expired:
            self._count("holds_expired")
            self._submit(_Work("release", reply.keys, reply.peer, stalled=True))
        for peer in recovered:
            self._submit(_Work("unstall", [], peer))

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the server thread, join it, and close the listener and transport."""
        self._stop.set()
        self._transport.wake()
        self._thread.join()
        if self._driver is not None:
            self._driver.join()
        self._listener.close()
        self._transport.close()
