"""Transports for the peer tier: frames between processes, behind a small interface.

The peer tier and the peer server use only ``Transport``, ``Channel`` and ``Listener``; a
transport moves lists of frames (buffers) and never looks inside them. Two implement them, both
sending a payload frame straight out of the caller's buffer (its release reported by a
``SendReceipt``) and landing a received frame in a buffer the receiver chose with a ``Place``:

* ``ZmqTransport`` (``zmq_transport``, ``transport: "zmq"``, the default): a DEALER per
  connected peer, one ROUTER per listener, ``copy=False`` both ways, CURVE if configured. A
  landed frame is copied out of ZeroMQ's own message buffer;
* ``TcpTransport`` (``tcp_transport``, ``transport: "tcp"``): plain TCP sockets, never
  encrypted; a landed frame comes straight from the kernel, one copy fewer.

An RDMA transport (UCX, NIXL) would implement the same three protocols.

CURVE (``CurveClient``/``CurveServer``, in ``curve_keys``) encrypts and authenticates: a
listener with a ``CurveServer`` admits only clients whose public key is in ``allowed``; the
handshake of any other client fails inside ZeroMQ and never reaches the listener.

Bounds: every socket refuses frames longer than its ``max_frame_bytes`` plus
``FRAME_MARGIN_BYTES`` (the sender is disconnected by libzmq; the margin covers CURVE, which
carries each frame in a MESSAGE command 33 bytes longer). A listener also takes its
``MessageLimits``: at most ``RECV_QUEUE_MESSAGES`` whole messages queued per connection, a
``ConnectionBounds`` that cuts off a connection whose unfinished message grows past what that
queue may hold, and a receive loop that takes a message frame by frame and drops (without
keeping its frames) one with too many frames or bytes, disconnecting its sender.

Thread safety: a transport and everything it created belong to one thread (ZeroMQ sockets are
not thread-safe), except ``wake``, which any thread may call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

#: Whole messages a listener queues per connection before libzmq stops reading from it.
RECV_QUEUE_MESSAGES = 4
#: Room above a socket's largest frame: CURVE adds 33 bytes per frame (a MESSAGE command: name 8,
#: nonce 8, flags 1, MAC 16), and libzmq checks its limit against that.
FRAME_MARGIN_BYTES = 256
#: TCP keepalive of every connection, both transports, both ends: the first probe after this
#: many seconds without traffic, then one every ``KEEPALIVE_INTERVAL_S``; the
#: ``KEEPALIVE_PROBES``-th unanswered fails the connection (about 90 s after its peer vanished
#: without closing: a host powered off, a cable cut), which nothing else on a quiet connection
#: would ever notice.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 60, 10, 3

Buffer = bytes | memoryview


@dataclass(frozen=True)
class Landing:
    """Where a frame lands: ``buffer``, and ``feed(filled)`` (if given), called each time more
    of the frame has landed (``buffer[:filled]``), so that a streaming checksum takes each piece
    while it is still in the CPU cache. A transport that receives the frame whole into memory
    of its own calls ``copy_in(frame)`` instead, where given: it copies the frame to the start
    of ``buffer`` and takes the checksum in the same pass (a copy, then a checksum of
    ``buffer``, reads the frame twice); a ``ValueError`` from it refuses the frame, which then
    comes back empty, as one too long for ``buffer`` does."""

    buffer: memoryview
    feed: Callable[[int], object] | None = None
    copy_in: Callable[[Buffer], object] | None = None


#: ``place(i, frames)``: called before frame ``i >= 1`` of a message is received, with frames
#: ``0..i-1``; returns where frame ``i`` lands (a ``Landing``, or a writable buffer), or ``None``
#: (the frame is then received as usual). A landed frame comes back as that buffer cut to the
#: frame's length; a frame longer than its buffer is cut off and comes back empty.
Place = Callable[[int, Sequence[memoryview]], "Landing | memoryview | None"]


def landing(found: Landing | memoryview | None) -> Landing | None:
    """What a ``Place`` returned, as a ``Landing``."""
    return Landing(found) if isinstance(found, memoryview) else found


class SendReceipt(Protocol):
    """Says when the transport no longer reads the buffers it was given."""

    @property
    def done(self) -> bool: ...


class Channel(Protocol):
    """A connection to one peer (client side)."""

    def send(self, frames: Sequence[Buffer]) -> bool:
        """Queue one message; ``False`` when it cannot be queued now."""
        ...

    def recv(self, place: Place | None = None) -> list[memoryview] | None:
        """The next whole message, or ``None`` when none has arrived (never blocks)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class MessageLimits:
    """What one message a listener receives may be: frames, bytes per frame, bytes in all."""

    max_frame_bytes: int
    max_frames: int
    max_message_bytes: int

    @property
    def wire_bytes(self) -> int:
        """The most one such message takes on the wire (framing and CURVE included)."""
        return self.max_message_bytes + self.max_frames * FRAME_MARGIN_BYTES


class Listener(Protocol):
    """Accepts peers; messages carry the sending peer's opaque id (server side)."""

    port: int

    def send(self, peer: bytes, frames: Sequence[Buffer]) -> SendReceipt: ...

    def recv(self) -> tuple[bytes, list[memoryview], bytes | None] | None:
        """The next message within the limits, or ``None`` when none waits (never blocks):
        (the peer's id, the frames, the name its credentials proved, ``None`` if none did)."""
        ...

    def stats(self) -> dict[str, int]:
        """Counters: messages dropped over the limits, connections cut off and why."""
        ...

    def close(self) -> None: ...


class Transport(Protocol):
    def connect(self, host: str, port: int, limits: MessageLimits) -> Channel:
        """A channel to ``host:port`` whose incoming messages (replies) stay within ``limits``."""
        ...

    def listen(self, host: str, port: int, limits: MessageLimits) -> Listener: ...

    def wait(self, timeout_s: float) -> None:
        """Block until a channel or listener may have a message, ``wake`` is called, or timeout."""
        ...

    def wake(self) -> None: ...

    def close(self) -> None: ...
