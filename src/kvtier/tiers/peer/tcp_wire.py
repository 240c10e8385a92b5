"""The plain-TCP transport's wire format: a greeting, then messages of length-prefixed frames.

Each side first sends ``GREETING`` (8 bytes: ``KVTIER``, wire version 1, 0) and drops a
connection whose first 8 bytes differ (another program, a ZeroMQ peer, an older wire). A message
is a ``u32`` frame count, a ``u64`` length per frame (little-endian), then the frames' bytes. The
count and the lengths are checked against ``MessageLimits`` before any frame byte is read
(``Violation``): what a peer claims never sizes a buffer beyond those limits, and a frame's
buffer is made only when its first byte is due.

``Incoming`` reads one connection's messages with nonblocking ``recv_into``: a frame the caller's
``Place`` gives a buffer for lands straight in it (the kernel's copy is the only one), the others
get a buffer of their own. ``Outgoing`` writes queued messages with ``sendmsg`` straight out of
the caller's buffers and marks each message's ``Receipt`` done once the kernel has all of it.

Thread safety: none; both belong to the thread that owns the transport.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from socket import MSG_NOSIGNAL, socket

from kvtier.tiers.peer.transport import Buffer, MessageLimits, Place, landing

GREETING = b"KVTIER\x01\x00"
_COUNT = struct.Struct("<I")
#: Buffers handed to one ``sendmsg`` (Linux's ``IOV_MAX`` is 1024).
MAX_IOV = 512
#: Bytes of a frame too long for its landing buffer are read into this much scratch at a time.
DISCARD_BYTES = 64 << 10


class Closed(Exception):
    """The connection ended (the peer closed it, or a socket error)."""


class Violation(Exception):
    """The peer broke the wire format or the limits; ``reason`` names how (a counter)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode(frames: Sequence[Buffer]) -> list[memoryview]:
    """``frames`` as the buffers of one message on the wire (no frame is copied)."""
    views = [memoryview(f).cast("B") for f in frames]
    prefix = _COUNT.pack(len(views)) + struct.pack(f"<{len(views)}Q", *(len(v) for v in views))
    return [memoryview(prefix), *(v for v in views if len(v))]


def _read(sock: socket, view: memoryview) -> int:
    """Bytes read into ``view`` (at least one), 0 when none has arrived; ``Closed`` at the end."""
    try:
        n = sock.recv_into(view)
    except (BlockingIOError, InterruptedError):
        return 0
    except OSError as exc:
        raise Closed(str(exc)) from exc
    if n == 0:
        raise Closed("closed by the peer")
    return n


class Incoming:
    """One connection's incoming bytes, cut into whole messages within ``limits``."""

    def __init__(self, limits: MessageLimits) -> None:
        self._limits = limits
        self._greeted = False
        self._scratch: memoryview | None = None  # made at the first frame to skip
        self._reset()

    def _reset(self) -> None:
        self._phase = "count" if self._greeted else "greeting"
        self._buffer = memoryview(bytearray(_COUNT.size if self._greeted else len(GREETING)))
        self._got = 0
        self._lengths: list[int] = []
        self._frames: list[memoryview] = []
        self._discard = 0  # bytes of a frame too long for its landing, still to skip
        self._feed: Callable[[int], object] | None = None  # the landing frame's

    @property
    def started(self) -> bool:
        """Whether part of a message has arrived (or the greeting is due)."""
        return self._phase != "count" or self._got > 0

    def pump(self, sock: socket, place: Place | None = None) -> list[memoryview] | None:
        """Read what has arrived: the next whole message's frames, or ``None`` while it is not
        whole. Raises ``Closed`` or ``Violation`` (the caller then drops the connection)."""
        while True:
            if self._discard:
                if self._scratch is None:
                    self._scratch = memoryview(bytearray(DISCARD_BYTES))
                n = _read(sock, self._scratch[: min(self._discard, DISCARD_BYTES)])
                self._discard -= n
            elif self._got < len(self._buffer):
                n = _read(sock, self._buffer[self._got :])
                self._got += n
                if n and self._feed is not None:
                    self._feed(self._got)
            else:
                message = self._advance(place)
                if message is not None:
                    return message
                continue
            if n == 0:
                return None

    def _advance(self, place: Place | None) -> list[memoryview] | None:
        """The current buffer is full: check it, and set up the next one."""
        if self._phase == "greeting":
            if bytes(self._buffer) != GREETING:
                raise Violation("bad_greeting")
            self._greeted = True
            self._reset()
        elif self._phase == "count":
            (count,) = _COUNT.unpack(self._buffer)
            if not 1 <= count <= self._limits.max_frames:
                raise Violation("too_many_frames" if count else "empty_message")
            self._phase, self._buffer, self._got = "lengths", memoryview(bytearray(8 * count)), 0
        elif self._phase == "lengths":
            self._lengths = list(struct.unpack(f"<{len(self._buffer) // 8}Q", self._buffer))
            if max(self._lengths) > self._limits.max_frame_bytes:
                raise Violation("oversized_frame")
            if sum(self._lengths) > self._limits.max_message_bytes:
                raise Violation("oversized_message")
            self._phase = "frame"
            self._next_frame(place)
        else:
            self._frames.append(self._buffer)
            if len(self._frames) == len(self._lengths):
                frames = self._frames
                self._reset()
                return frames
            self._next_frame(place)
        return None

    def _next_frame(self, place: Place | None) -> None:
        """Where frame ``len(self._frames)`` lands: the caller's buffer, or one of its own."""
        index, self._got, self._feed = len(self._frames), 0, None
        length = self._lengths[index]
        land = landing(place(index, self._frames)) if place is not None and index else None
        if land is None:
            self._buffer = memoryview(bytearray(length))
        elif len(land.buffer) >= length:
            self._buffer, self._feed = land.buffer[:length], land.feed
        else:  # cut off: it comes back empty, its bytes skipped
            self._buffer, self._discard = land.buffer[:0], length


class Receipt:
    """``done`` once the kernel holds every byte of the message (or it was dropped)."""

    def __init__(self, done: bool = False) -> None:
        self.done = done


class Outgoing:
    """Messages queued for one connection, written as the socket takes them."""

    def __init__(self) -> None:
        self._queue: deque[tuple[list[memoryview], Receipt]] = deque()
        self.moved_at = time.monotonic()  # when the socket last took bytes, or the queue emptied

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    @property
    def messages(self) -> int:
        """Messages queued, the one being written included."""
        return len(self._queue)

    def put(self, buffers: list[memoryview]) -> Receipt:
        receipt = Receipt()
        if not self._queue:
            self.moved_at = time.monotonic()
        self._queue.append((buffers, receipt))
        return receipt

    def flush(self, sock: socket) -> None:
        """Write until the socket takes no more; ``Closed`` on a socket error."""
        while self._queue:
            buffers, receipt = self._queue[0]
            try:
                sent = sock.sendmsg(buffers[:MAX_IOV], (), MSG_NOSIGNAL)  # EPIPE, not SIGPIPE
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                raise Closed(str(exc)) from exc
            _advance(buffers, sent)
            self.moved_at = time.monotonic()
            if not buffers:
                receipt.done = True
                self._queue.popleft()

    def abandon(self) -> None:
        """Drop every queued message: their buffers are no longer read."""
        for _, receipt in self._queue:
            receipt.done = True
        self._queue.clear()


def _advance(buffers: list[memoryview], sent: int) -> None:
    """Take ``sent`` bytes off the front of ``buffers``."""
    whole = 0
    while whole < len(buffers) and sent >= len(buffers[whole]):
        sent -= len(buffers[whole])
        whole += 1
    del buffers[:whole]
    if sent:
        buffers[0] = buffers[0][sent:]
