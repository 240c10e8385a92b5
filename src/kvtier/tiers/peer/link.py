"""PeerLink: the peer tier's connection to one peer, its handshake, requests and reconnection.

States: ``CONNECTING`` (first handshake; requests wait for it), ``UP``, ``DOWN`` (requests fail at
once) and ``PROBING`` (a reconnection handshake is out; requests still fail at once). Any request
or handshake left unanswered past ``timeout_s`` takes the link ``DOWN``: its channel is closed
(dropping whatever was queued in it), every request it carried finishes as failed, and it probes
again after a backoff that doubles up to ``MAX_BACKOFF_S``. A peer that answers "hello first"
lost our session (it restarted): the link shakes hands again.

A FETCH request may name a ``landing`` buffer per key (its host slot): the payload frames of
its reply are then received straight into them (``transport.Place``), but only while the request
is in flight here, so a late reply never writes into a slot that was given back. Each landed
payload is checksummed (xxh3-128) piece by piece as it lands, while its bytes are still in the CPU
cache (unless the tier checks a tag instead), and the request's ``checksums`` map that payload's
buffer to its checksum; landed bytes are not verified yet: the caller verifies them (header and
checksum or tag) before it reports success.

Each request finishes exactly once, through ``on_done(link, request, reply)`` with the peer's
validated reply, or ``None`` when it failed. ``on_down(link)`` is called when the link goes down.
``accepts_stores`` is what the peer's last handshake said (False until one answered); a STORE
for a peer that does not accept stores fails here and never travels (``stores_not_accepted``).

Thread safety: none; a link belongs to the peer tier's I/O thread.
"""

from __future__ import annotations

import enum
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtier.tiers.peer import protocol as proto
from kvtier.tiers.peer.transport import Buffer, Channel, Landing, Transport
from kvtier.tiers.shared import codec
from kvtier.tiers.shared.circuit import Backoff

log = logging.getLogger(__name__)

MAX_REPLIES_PER_TURN = 256
MIN_BACKOFF_S, MAX_BACKOFF_S = 0.2, 5.0


class State(enum.Enum):
    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"
    PROBING = "probing"


@dataclass
class PeerRequest:
    """A LOOKUP, FETCH or STORE to one peer; ``context`` is the caller's (slots, job, ...)."""

    kind: int
    keys: Sequence[Any]
    context: Any = None
    frames: list[Buffer] = field(default_factory=list)  # STORE: header and payload per key
    landing: list[memoryview] = field(default_factory=list)  # FETCH: where each payload lands
    #: FETCH: id of a landed payload frame of the reply -> (that frame, its checksum or None)
    checksums: dict[int, tuple[memoryview, bytes | None]] = field(default_factory=dict)
    req_id: int = 0
    deadline: float = 0.0


Done = Callable[["PeerLink", PeerRequest, "proto.Reply | None"], None]


class PeerLink:
    """One peer at ``host:port``; see the module docstring."""

    def __init__(
        self,
        host: str,
        port: int,
        transport: Transport,
        settings: tuple[bytes, int, float, bool],  # identity digest, chunk bytes, timeout_s,
        # whether to checksum landed payloads (not when a tag is checked instead)
        on_done: Done,
        on_down: Callable[[PeerLink], None],
        counters: Counter[str],
    ) -> None:
        self.host, self.port, self.address = host, port, f"{host}:{port}"
        self._transport, self._on_done, self._on_down = transport, on_done, on_down
        self._counters = counters
        self._digest, self._chunk_bytes, self._timeout, self._checksum = settings
        self.state, self.accepts_stores = State.DOWN, False
        self._channel: Channel | None = None
        self._ids = itertools.count(1)
        self._hello_id, self._hello_deadline = 0, 0.0
        self._in_flight: dict[int, PeerRequest] = {}
        self._queued: deque[PeerRequest] = deque()
        self._backoff, self._retry_at = Backoff(MIN_BACKOFF_S, MAX_BACKOFF_S), 0.0
        self._landing: list[memoryview] = []  # of the reply being received
        self._landed_at = 0  # frame index of that reply's last payload received into _landing
        self._filling: Any = None  # that payload's checksum as it lands (codec.filling)
        self._checksums: dict[int, tuple[memoryview, bytes | None]] = {}  # of its payloads
        self._open(State.CONNECTING)

    # -- requests ----------------------------------------------------------------------------
    def send(self, request: PeerRequest) -> None:
        """Send now, queue behind the handshake or the in-flight limit, or fail if down."""
        if self.state in (State.DOWN, State.PROBING):
            self._counters["requests_failed_peer_down"] += 1
            self._on_done(self, request, None)
            return
        self._queued.append(request)
        self._flush()

    def _flush(self) -> None:
        while (
            self.state is State.UP and self._queued and len(self._in_flight) < proto.MAX_IN_FLIGHT
        ):
            request = self._queued.popleft()
            if request.kind == proto.STORE and not self.accepts_stores:
                self._counters["stores_not_accepted"] += 1
                self._on_done(self, request, None)
                continue
            request.req_id = next(self._ids)
            request.deadline = time.monotonic() + self._timeout
            meta = proto.keyed(request.kind, request.req_id, request.keys)
            assert self._channel is not None
            if not self._channel.send([meta, *request.frames]):
                self._fail_link("cannot queue a request")
                self._on_done(self, request, None)
                return
            self._in_flight[request.req_id] = request

    # -- replies -----------------------------------------------------------------------------
    def receive(self) -> None:
        """Handle the replies that have arrived, at most ``MAX_REPLIES_PER_TURN``: a peer that
        floods us must leave the I/O thread time for its timeouts and other peers."""
        for _ in range(MAX_REPLIES_PER_TURN):
            if self._channel is None:
                return
            frames = self._channel.recv(self._place)  # a message may take several calls
            if frames is None:
                return
            self._checksum_landed(frames, len(frames))
            checksums, self._landed_at, self._checksums = self._checksums, 0, {}
            try:
                reply = proto.decode_reply(frames, self._chunk_bytes)
            except proto.ProtocolError as exc:
                self._counters["malformed_replies"] += 1
                level = (
                    logging.WARNING if self._counters["malformed_replies"] == 1 else logging.DEBUG
                )
                log.log(level, "peer %s sent a malformed reply (%s)", self.address, exc.reason)
                continue
            if isinstance(reply, proto.HelloReply):
                self._on_hello(reply)
            elif isinstance(reply, proto.Refused):
                self._on_refused(reply)
            else:
                self._on_reply(reply, checksums)

    def _place(self, index: int, frames: Sequence[memoryview]) -> Landing | None:
        """Frame ``index`` of a reply: a payload of an in-flight FETCH lands in its buffer,
        checksummed piece by piece as it lands."""
        if index == 1:  # a new message: nothing of another one carries over
            self._landing = self._landing_for(frames[0])
            self._landed_at, self._checksums, self._filling = 0, {}, None
        self._checksum_landed(frames, index)
        found = index // 2 - 1  # frames: meta, then header and payload per found key
        if index % 2 or found >= len(self._landing):
            return None
        self._landed_at = index
        buffer = self._landing[found]
        if not self._checksum:
            self._filling = None
            return Landing(buffer)
        self._filling = codec.filling(buffer)
        return Landing(buffer, self._filling.feed, self._filling.copy_in)

    def _checksum_landed(self, frames: Sequence[memoryview], received: int) -> None:
        """The checksum of frame ``received - 1`` if it landed (folded in as it landed)."""
        if self._landed_at and self._landed_at == received - 1:
            payload = frames[self._landed_at]
            filling, self._filling = self._filling, None
            digest = filling.digest(len(payload)) if filling is not None else None
            self._checksums[id(payload)] = (payload, digest)

    def _landing_for(self, meta: memoryview) -> list[memoryview]:
        fetched = proto.fetch_flags(meta)
        request = self._in_flight.get(fetched[0]) if fetched is not None else None
        if fetched is None or request is None or request.kind != proto.FETCH:
            return []
        flags = fetched[1]
        if len(flags) != len(request.keys) or len(request.landing) != len(flags):
            return []
        return [buffer for buffer, found in zip(request.landing, flags, strict=True) if found]

    def _on_hello(self, reply: proto.HelloReply) -> None:
        if reply.req_id != self._hello_id or self.state not in (State.CONNECTING, State.PROBING):
            return
        if not reply.ok:
            self._counters["handshakes_refused"] += 1
            log.error("peer %s refused us: %s", self.address, reply.reason)
            self._backoff.give_up()
            self._fail_link("handshake refused", quiet=True)
            return
        if self.state is State.PROBING:
            log.warning("peer %s answers again; reconnected", self.address)
        self.state, self.accepts_stores = State.UP, reply.accepts_stores
        self._backoff.reset()
        self._flush()

    def _on_refused(self, reply: proto.Refused) -> None:
        request = self._in_flight.pop(reply.req_id, None)
        if request is not None:
            self._on_done(self, request, None)
        if self.state is State.UP:
            log.warning(
                "peer %s lost our session (%s); shaking hands again", self.address, reply.reason
            )
            self._hello(State.CONNECTING)

    def _on_reply(
        self, reply: proto.Reply, checksums: dict[int, tuple[memoryview, bytes | None]]
    ) -> None:
        request = self._in_flight.pop(reply.req_id, None)
        if request is None:
            self._counters["stale_replies"] += 1
            return
        if reply.kind != request.kind or len(reply.flags) != len(request.keys):
            self._counters["mismatched_replies"] += 1
            self._on_done(self, request, None)
        else:
            request.checksums = checksums
            self._on_done(self, request, reply)
        self._flush()

    # -- time --------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Time out late answers; start a reconnection probe when one is due."""
        if self.state is State.DOWN:
            if now >= self._retry_at:
                self._open(State.PROBING)
            return
        if self.state is not State.UP and now >= self._hello_deadline:
            self._fail_link(f"no handshake within {self._timeout:g} s")
        elif any(r.deadline <= now for r in self._in_flight.values()):
            self._fail_link(f"no answer within {self._timeout:g} s")

    @property
    def busy(self) -> bool:
        return bool(self._in_flight or self._queued) or self.state is not State.UP

    def _open(self, state: State) -> None:
        limits = proto.reply_limits(self._chunk_bytes)
        self._channel = self._transport.connect(self.host, self.port, limits)
        self._hello(state)

    def _hello(self, state: State) -> None:
        self.state, self._hello_id = state, next(self._ids)
        self._hello_deadline = time.monotonic() + self._timeout
        assert self._channel is not None
        self._channel.send([proto.hello(self._hello_id, self._digest)])

    def _fail_link(self, reason: str, quiet: bool = False) -> None:
        if self.state in (State.UP, State.CONNECTING) and not quiet:
            log.warning(
                "peer %s unreachable (%s); its chunks are misses until it answers",
                self.address,
                reason,
            )
        self._counters["peer_failures"] += 1
        self.state = State.DOWN
        self._retry_at = time.monotonic() + self._backoff.next_delay()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        failed = [*self._in_flight.values(), *self._queued]
        self._in_flight.clear()
        self._queued.clear()
        for request in failed:
            self._on_done(self, request, None)
        self._on_down(self)

    def close(self) -> None:
        """Close the channel; requests still out finish as failed."""
        self._fail_link("closing", quiet=True)
