"""TcpTransport: the peer tier's ``Transport`` over plain TCP sockets (``transport: "tcp"``).

Why: a fetched payload lands in its host slot straight from the kernel (``recv_into``), one
copy where ZeroMQ makes two (the kernel's into libzmq's message, then ``recv_into`` out of it).
Nothing is encrypted or authenticated: CURVE needs ``transport: "zmq"`` (the configuration
refuses both at once), so this is for loopback or a network only trusted hosts reach.

Everything runs on the thread that owns the transport: ``wait`` polls every socket, accepts
new connections, finishes connects and writes queued bytes as sockets take them; ``recv`` reads
what has arrived without blocking. The wire format and its bounds are ``tcp_wire``'s. A
listener keeps at most ``MAX_CONNECTIONS``: a new one then displaces the connection quiet
longest (no whole message from it, no byte written to it) if that has been quiet for
``DISPLACE_QUIET_S`` (``connections_displaced_quiet``), so that clients that connect and say
nothing cannot hold every place; otherwise the new one is closed at once
(``connections_dropped_over_limit``). One whose peer vanished without closing fails its
keepalive probes within about 90 s and leaves. A listener drops a connection that breaks the
format or its ``MessageLimits`` (``connections_dropped_<reason>``), and one whose greeting or
unfinished message is older than ``UNFINISHED_S`` (``connections_dropped_stalled``): what a
client sends is held one message at a time, and never for long. A client's channel that
breaks is closed; its requests then time out (``timeout_s``) and the link reconnects. A peer
named by a host name is resolved on a thread of its own, waited for at most
``RESOLVE_TIMEOUT_S`` (``tcp_sockets``).

Thread safety: a transport and everything it created belong to one thread, except ``wake``,
which any thread may call.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import select
import socket
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from kvtier.errors import ConfigError
from kvtier.tiers.peer import tcp_sockets
from kvtier.tiers.peer.protocol import MAX_IN_FLIGHT
from kvtier.tiers.peer.tcp_sockets import nonblocking, stream
from kvtier.tiers.peer.tcp_wire import (
    GREETING,
    Closed,
    Incoming,
    Outgoing,
    Receipt,
    Violation,
    encode,
)
from kvtier.tiers.peer.transport import Buffer, MessageLimits, Place, SendReceipt
from kvtier.tiers.peer.wake_pipe import WakePipe

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 1024
UNFINISHED_S = 30.0
#: How long a connection must have been quiet before a new one may take its place at the limit:
#: long beside a kvtier client's gaps between requests under load, short beside how long a
#: place would otherwise be held (for ever).
DISPLACE_QUIET_S = 10.0
SWEEP_S = 0.1  # how often a listener looks for stalled connections
ACCEPT_PAUSE_S = 0.5  # a listener that failed to accept (EMFILE) rests this long
#: Replies queued for one connection at most, as many as a kvtier client has requests out: then
#: its requests are left unread, and a reply past it is dropped (``replies_dropped_backlog``), so
#: a peer that does not read cannot make the server queue more.
MAX_QUEUED_REPLIES = MAX_IN_FLIGHT
_IN, _OUT = select.POLLIN | select.POLLPRI, select.POLLOUT
_STREAM = socket.SOCK_STREAM


class _Conn:
    """One TCP connection: its socket, what it is receiving, what waits to be written."""

    def __init__(
        self,
        sock: socket.socket,
        limits: MessageLimits,
        peer: bytes = b"",
        listener: TcpListener | None = None,
    ) -> None:
        self.sock, self.peer, self.fd, self.listener = sock, peer, sock.fileno(), listener
        self.incoming, self.outgoing = Incoming(limits), Outgoing()
        self.outgoing.put([memoryview(GREETING)])
        self.connecting = self.closed = self.ready = False
        self.addresses: list[tuple[int, Any]] = []  # a client's addresses still to try
        self.since: float | None = time.monotonic()  # the greeting is due
        self.heard_at = time.monotonic()  # connected, or the last whole message in

    @property
    def backlogged(self) -> bool:
        """Whether so much waits to be sent that the peer's requests are left unread for now."""
        return self.outgoing.messages >= MAX_QUEUED_REPLIES

    def pump(self, place: Place | None) -> list[memoryview] | None:
        """The next whole message (``Closed``, ``Violation``); notes when one is unfinished."""
        if self.connecting:
            return None
        message = self.incoming.pump(self.sock, place)
        self.since = None if not self.incoming.started else self.since or time.monotonic()
        self.ready = message is not None
        if message is not None:
            self.heard_at = time.monotonic()
        return message


class _Channel:
    """``Channel``: a connection to one server."""

    def __init__(self, transport: TcpTransport, conn: _Conn) -> None:
        self._transport, self._conn = transport, conn

    def send(self, frames: Sequence[Buffer]) -> bool:
        if self._conn.closed:
            return False
        self._conn.outgoing.put(encode(frames))
        self._transport.flush(self._conn)
        return not self._conn.closed

    def recv(self, place: Place | None = None) -> list[memoryview] | None:
        if self._conn.closed:
            return None
        try:
            return self._conn.pump(place)
        except Closed as exc:  # the link times its requests out, then reconnects
            log.debug("peer connection closed: %s", exc)
        except Violation as exc:
            log.warning("peer sent what the wire does not allow (%s); disconnected", exc.reason)
        self._transport.drop(self._conn)
        return None

    def close(self) -> None:
        self._transport.drop(self._conn)


class TcpListener:
    """``Listener`` on one port; see the module docstring."""

    def __init__(self, transport: TcpTransport, sock: socket.socket, limits: MessageLimits):
        self.port: int = sock.getsockname()[1]
        self.sock, self.fd = sock, sock.fileno()
        self._transport, self._limits = transport, limits
        self._conns: dict[bytes, _Conn] = {}
        self._counters: Counter[str] = Counter()
        self._ids = itertools.count(1)
        self._sweep_at = 0.0
        self.resume_at = 0.0  # after a failed accept, not polled before then

    def accept(self) -> None:
        """Take every waiting connection (the transport's ``wait``, on this socket's POLLIN)."""
        while True:
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: the client waits in the backlog
                self._counters["accept_failures"] += 1
                self.resume_at = time.monotonic() + ACCEPT_PAUSE_S  # else poll spins on it
                log.warning("peer server: cannot accept a connection: %s", exc)
                return
            if len(self._conns) >= MAX_CONNECTIONS and not self._displace_quiet():
                self._counters["connections_dropped_over_limit"] += 1
                sock.close()
                continue
            nonblocking(sock)  # an accepted socket blocks whatever its listener does
            conn = _Conn(sock, self._limits, b"tcp:%d" % next(self._ids), self)
            self._conns[conn.peer] = conn
            self._transport.add(conn)

    def _displace_quiet(self) -> bool:
        """Close the connection quiet longest, if for ``DISPLACE_QUIET_S``; whether one was."""
        quietest = min(self._conns.values(), key=_last_heard_or_sent, default=None)
        if quietest is None or time.monotonic() - _last_heard_or_sent(quietest) < DISPLACE_QUIET_S:
            return False
        self._counters["connections_displaced_quiet"] += 1
        self.forget(quietest)
        return True

    def send(self, peer: bytes, frames: Sequence[Buffer]) -> SendReceipt:
        conn = self._conns.get(peer)
        if conn is None or conn.closed:
            return Receipt(done=True)  # gone: nothing will read the buffers
        if conn.backlogged:  # as ZeroMQ past its high-water mark: the client times out
            self._counters["replies_dropped_backlog"] += 1
            return Receipt(done=True)
        receipt = conn.outgoing.put(encode(frames))
        self._transport.flush(conn)
        return receipt

    def recv(self) -> tuple[bytes, list[memoryview], bytes | None] | None:
        """The next whole message of a connection that has bytes waiting, or ``None``."""
        now = time.monotonic()
        if now >= self._sweep_at:
            self._sweep_at = now + SWEEP_S
            self._drop_stalled(now)
        for conn in [c for c in self._conns.values() if c.ready and not c.backlogged]:
            try:
                message = conn.pump(None)
            except (Closed, Violation) as exc:
                if isinstance(exc, Violation):
                    self._counters[f"connections_dropped_{exc.reason}"] += 1
                self.forget(conn)
                continue
            if message is not None:
                self._conns[conn.peer] = self._conns.pop(conn.peer)  # the others go first next
                return conn.peer, message, None
        return None

    def _drop_stalled(self, now: float) -> None:
        """Connections whose message in (``connections_dropped_stalled``) or replies out
        (``connections_dropped_slow_reader``) have not moved for ``UNFINISHED_S``."""
        for conn in list(self._conns.values()):
            if conn.since is not None and now - conn.since > UNFINISHED_S:
                self._counters["connections_dropped_stalled"] += 1
                self.forget(conn)
            elif conn.outgoing.pending and now - conn.outgoing.moved_at > UNFINISHED_S:
                self._counters["connections_dropped_slow_reader"] += 1
                self.forget(conn)

    def forget(self, conn: _Conn) -> None:
        """Close ``conn``; it leaves this listener's table (``drop`` calls ``discard``)."""
        self._transport.drop(conn)

    def discard(self, conn: _Conn) -> None:
        """``conn`` was closed (by the listener, or by a failed send): forget its entry."""
        self._conns.pop(conn.peer, None)

    def stats(self) -> dict[str, int]:
        return dict(self._counters)

    def close(self) -> None:
        for conn in list(self._conns.values()):
            self.forget(conn)
        self._transport.unlisten(self)


class TcpTransport:
    """Plain TCP; see the module docstring. Owns every socket it made."""

    def __init__(self) -> None:
        self._poller = select.poll()
        self._masks: dict[int, int] = {}
        self._conns: dict[int, _Conn] = {}
        self._listeners: dict[int, TcpListener] = {}
        self._wakes = WakePipe()
        self._poller.register(self._wakes.fd, select.POLLIN)

    def connect(self, host: str, port: int, limits: MessageLimits) -> _Channel:
        """A channel to ``host:port``, connecting in the background (bytes sent meanwhile wait)
        to each address the name resolves to in turn until one takes; with none, the channel
        is closed (its sends fail)."""
        found = tcp_sockets.resolve(host, port)
        if isinstance(found, str):
            log.warning("peer %s:%d: cannot resolve the address: %s", host, port, found)
        conn = _Conn(stream(socket.AF_INET, _STREAM, 0), limits)  # replaced by the first try
        conn.addresses = [] if isinstance(found, str) else found
        self.add(conn)
        self._connect_next(conn)
        return _Channel(self, conn)

    def _connect_next(self, conn: _Conn) -> None:
        """Start connecting ``conn`` to its next address; drop it when none is left."""
        while conn.addresses:
            family, address = conn.addresses.pop(0)
            self._forget_fd(conn)
            conn.sock.close()
            conn.sock = stream(family, _STREAM, 0)
            conn.fd = conn.sock.fileno()
            self.add(conn)
            error = conn.sock.connect_ex(address)
            conn.connecting = error in (errno.EINPROGRESS, errno.EAGAIN)
            if not error or conn.connecting:
                self._remask(conn)
                return
        self.drop(conn)

    def listen(self, host: str, port: int, limits: MessageLimits) -> TcpListener:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        host = "" if host == "*" else host  # ZeroMQ's "every interface"
        sock = stream(family, _STREAM, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            raise ConfigError(
                f"serve.host, serve.port: cannot listen on {host}:{port} ({exc})"
            ) from exc
        listener = TcpListener(self, sock, limits)
        self._listeners[listener.fd] = listener
        self._masks[listener.fd] = _IN
        self._poller.register(listener.fd, _IN)
        return listener

    def add(self, conn: _Conn) -> None:
        self._conns[conn.fd] = conn
        self._masks[conn.fd] = mask = _mask(conn)
        self._poller.register(conn.fd, mask)

    def drop(self, conn: _Conn) -> None:
        """Close ``conn``; what it had queued is abandoned (its receipts are done)."""
        if conn.closed:
            return
        conn.closed = True
        conn.outgoing.abandon()
        if conn.listener is not None:
            conn.listener.discard(conn)
        self._forget_fd(conn)
        conn.sock.close()

    def _forget_fd(self, conn: _Conn) -> None:
        if self._conns.pop(conn.fd, None) is not None:
            self._masks.pop(conn.fd, None)
            self._poller.unregister(conn.fd)

    def unlisten(self, listener: TcpListener) -> None:
        if self._listeners.pop(listener.fd, None) is not None:
            self._masks.pop(listener.fd, None)
            self._poller.unregister(listener.fd)
            listener.sock.close()

    def flush(self, conn: _Conn) -> None:
        """Write what ``conn`` has queued, as far as its socket takes it now."""
        if conn.connecting or conn.closed:
            return
        try:
            conn.outgoing.flush(conn.sock)
        except Closed as exc:
            log.debug("peer connection closed while sending: %s", exc)
            self.drop(conn)
            return
        self._remask(conn)

    def wait(self, timeout_s: float) -> None:
        self._remask_listeners()
        for fd, events in self._poller.poll(max(0, int(timeout_s * 1000))):
            if fd == self._wakes.fd:
                self._wakes.drain()
            elif fd in self._listeners:
                self._listeners[fd].accept()
            elif (conn := self._conns.get(fd)) is not None:
                self._on_events(conn, events)

    def _on_events(self, conn: _Conn, events: int) -> None:
        if conn.connecting and events & (_OUT | select.POLLERR | select.POLLHUP):
            error = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                log.debug("peer connection failed: %s", os.strerror(error))
                self._connect_next(conn)
                return
            conn.connecting = False
            self.flush(conn)  # the greeting; and poll for replies from now on
        elif events & _OUT:
            self.flush(conn)
        if events & ~_OUT:
            conn.ready = True

    def _remask(self, conn: _Conn) -> None:
        """Poll ``conn`` for what it waits for now (``_mask``). Called wherever that changes:
        a connect finished, bytes queued or written (``flush``), so ``wait`` costs nothing per
        idle connection."""
        self._set_mask(conn.fd, _mask(conn))

    def _remask_listeners(self) -> None:
        now = time.monotonic()
        for fd, listener in self._listeners.items():
            self._set_mask(fd, _IN if now >= listener.resume_at else 0)

    def _set_mask(self, fd: int, mask: int) -> None:
        if self._masks.get(fd) != mask:
            self._masks[fd] = mask
            self._poller.modify(fd, mask)

    def wake(self) -> None:
        self._wakes.wake()

    def close(self) -> None:
        for listener in list(self._listeners.values()):
            listener.close()
        for conn in list(self._conns.values()):
            self.drop(conn)
        self._wakes.close()


def _last_heard_or_sent(conn: _Conn) -> float:
    """When ``conn`` last gave a whole message, or its socket took bytes for it."""
    return max(conn.heard_at, conn.outgoing.moved_at)


def _mask(conn: _Conn) -> int:
    """What to poll ``conn`` for: its connect, its replies (unless too many wait), writability
    while bytes wait."""
    if conn.connecting:
        return _OUT
    return (0 if conn.backlogged else _IN) | (_OUT if conn.outgoing.pending else 0)
