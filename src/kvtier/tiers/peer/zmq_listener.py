"""ZmqListener: the ROUTER side of ``ZmqTransport``, receiving within ``MessageLimits``.

Replies go out zero-copy, each frame tracked so that ``SendReceipt.done`` says when libzmq no
longer reads the caller's buffers. A message is received frame by frame: one with more frames
than ``max_frames`` or more bytes than ``max_message_bytes`` is dropped, its remaining frames
taken off the socket without being kept, and its sender disconnected. Whatever a connection
sends without ever ending a message is bounded by the ``ConnectionBounds`` (``connection_bounds``):
at most the whole messages ``RECV_QUEUE_MESSAGES`` allows, and one more.

Thread safety: none; a listener belongs to the thread that owns its transport.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence

import zmq

from kvtier.tiers.peer.connection_bounds import ConnectionBounds
from kvtier.tiers.peer.transport import (
    RECV_QUEUE_MESSAGES,
    Buffer,
    MessageLimits,
    SendReceipt,
)

log = logging.getLogger(__name__)

#: Handshake bytes (ZMTP greeting, READY or CURVE HELLO/INITIATE and metadata) a guard allows.
HANDSHAKE_BYTES = 16 << 10


class _Tracked:
    def __init__(self, tracker: zmq.MessageTracker) -> None:
        self._tracker = tracker

    @property
    def done(self) -> bool:
        return bool(self._tracker.done)


class _Dropped:
    """The receipt of a reply that was never queued: nothing reads its buffers."""

    done = True


_NOT_SENT = _Dropped()


class ZmqListener:
    """A ROUTER listener with its ``ConnectionBounds``; see the module docstring."""

    def __init__(
        self,
        socket: zmq.Socket[bytes],
        port: int,
        limits: MessageLimits,
        monitor: zmq.Socket[bytes],
        forget: Callable[[zmq.Socket[bytes]], None],
    ) -> None:
        self.socket, self.port, self._forget = socket, port, forget
        self._limits, self._counters, self._monitor = limits, Counter[str](), monitor
        limit = (RECV_QUEUE_MESSAGES + 1) * limits.wire_bytes + HANDSHAKE_BYTES
        self._guard = ConnectionBounds(monitor, limit, self._counters)

    def send(self, peer: bytes, frames: Sequence[Buffer]) -> SendReceipt:
        """Queue one message; its receipt is done once libzmq no longer reads ``frames``.

        A client with ``SNDHWM`` replies queued, all unread, gets no more: the reply is dropped
        (``replies_dropped_backlog``), and the client's request times out.

        Frames below the socket's copy threshold are copied as they are queued (pyzmq does so
        for ``copy=False`` too), so only the longer ones are sent zero-copy and tracked.
        """
        threshold = self.socket.copy_threshold
        parts = [zmq.Frame(f, track=True) if _nbytes(f) >= threshold else f for f in frames]
        try:
            self.socket.send_multipart([peer, *parts], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # the client does not read: its queue is full (``SNDHWM``)
            self._counters["replies_dropped_backlog"] += 1
            return _NOT_SENT
        except zmq.ZMQError as exc:  # gone (``ROUTER_MANDATORY``); the client times out
            log.debug("peer server: reply dropped (%s)", exc)
            return _NOT_SENT
        return _Tracked(zmq.MessageTracker(*[p for p in parts if isinstance(p, zmq.Frame)]))

    def recv(self) -> tuple[bytes, list[memoryview], bytes | None] | None:
        """The next message within the limits as (routing id, frames, the sender's CURVE key
        in z85 or ``None`` without CURVE), or ``None`` when none waits (never blocks)."""
        while True:
            try:
                first = self.socket.recv(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            message = self._rest(first)
            if message is not None:
                return message

    def _rest(self, first: zmq.Frame) -> tuple[bytes, list[memoryview], bytes | None] | None:
        """The frames after the routing id ``first``; ``None`` if they broke the limits."""
        frames: list[memoryview] = []
        size, fd, more = 0, -1, first.more
        while more and len(frames) < self._limits.max_frames:
            frame = self.socket.recv(copy=False)
            if fd < 0:
                fd = _source_fd(frame)
            frames.append(frame.buffer)
            size, more = size + len(frame.buffer), frame.more
            if size > self._limits.max_message_bytes:
                break
        if not more and size <= self._limits.max_message_bytes:
            self._guard.delivered(fd)
            return first.bytes, frames, _user_of(first)
        self._drop_rest(more)
        self._counters["messages_dropped_oversized"] += 1
        self._guard.drop(fd, "oversized")
        return None

    def _drop_rest(self, more: bool) -> None:
        """Take the rest of a message off the socket without keeping it."""
        while more:
            more = self.socket.recv(copy=False).more

    def stats(self) -> dict[str, int]:
        return dict(self._counters)

    def close(self) -> None:
        """Stop the guard, then close the monitor and the router socket."""
        self._guard.close()
        self.socket.disable_monitor()
        self._monitor.close(linger=0)
        self._forget(self.socket)


def _nbytes(frame: Buffer) -> int:
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)


def _user_of(frame: zmq.Frame) -> bytes | None:
    """The User-Id ZAP gave ``frame``'s connection (the client's CURVE key), else ``None``."""
    try:
        user = frame.get("User-Id")
    except (zmq.ZMQError, AttributeError, UnicodeDecodeError):
        return None
    return str(user).encode() if user else None


def _source_fd(frame: zmq.Frame) -> int:
    """The descriptor of the connection ``frame`` came in on (``ZMQ_SRCFD``), else -1."""
    try:
        return int(frame.get(zmq.SRCFD))
    except (zmq.ZMQError, AttributeError):
        return -1
