"""TcpTransport: the peer tier's ``Transport`` over plain TCP sockets (``transport: "tcp"``).

Why: a fetched payload lands in its host slot straight from the kernel (``recv_into``), one
copy where ZeroMQ makes two (the kernel's into libzmq's message, then ``recv_into`` out of it).
Nothing is encrypted or authenticated: CURVE needs ``transport: "zmq"`` (the configuration
refuses both at once), so this is for loopback or a network only trusted hosts reach.

Everything runs on the thread that owns the transport: ``wait`` polls every socket, accepts
new connections, finishes connects and writes queued bytes as sockets take them; ``recv`` reads
what has arrived without blocking. The wire format and its bounds are ``tcp_wire``'s; what a
listener keeps, and drops, is ``tcp_listener``'s. A client's channel that breaks is closed;
its requests then time out (``timeout_s``) and the link reconnects. A peer named by a host
name is resolved in the background, for at most ``RESOLVE_TIMEOUT_S`` (``tcp_sockets``):
``connect`` returns at once, and what is sent meanwhile waits.

Thread safety: a transport and everything it created belong to one thread, except ``wake``,
which any thread may call.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import time
from collections.abc import Sequence

from kvtier.errors import ConfigError
from kvtier.tiers.peer import tcp_sockets
from kvtier.tiers.peer.tcp_conn import Conn
from kvtier.tiers.peer.tcp_listener import TcpListener
from kvtier.tiers.peer.tcp_sockets import stream
from kvtier.tiers.peer.tcp_wire import (
    Closed,
    Violation,
    encode,
)
from kvtier.tiers.peer.transport import Buffer, MessageLimits, Place
from kvtier.tiers.peer.wake_pipe import WakePipe

log = logging.getLogger(__name__)

_IN, _OUT = select.POLLIN | select.POLLPRI, select.POLLOUT
_STREAM = socket.SOCK_STREAM


class _Channel:
    """``Channel``: a connection to one server."""

    def __init__(self, transport: TcpTransport, conn: Conn) -> None:
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


class TcpTransport:
    """Plain TCP; see the module docstring. Owns every socket it made."""

    def __init__(self) -> None:
        self._poller = select.poll()
        self._masks: dict[int, int] = {}
        self._conns: dict[int, Conn] = {}
        self._listeners: dict[int, TcpListener] = {}
        self._wakes = WakePipe()
        self._poller.register(self._wakes.fd, select.POLLIN)
        self._resolver = tcp_sockets.Resolver(self._wakes.wake)

    def connect(self, host: str, port: int, limits: MessageLimits) -> _Channel:
        """A channel to ``host:port``, connecting in the background (bytes sent meanwhile wait)
        to each address the name resolves to in turn until one takes; with none, the channel
        is closed (its sends fail). A host name is resolved in the background too."""
        conn = Conn(stream(socket.AF_INET, _STREAM, 0), limits)  # replaced by the first try
        conn.connecting = True  # and not polled until then
        found = tcp_sockets.numeric(host, port)
        if found is not None:
            conn.addresses = list(found)  # a copy: the resolver keeps its answer for others
            self._connect_next(conn)
        elif self._resolver.start(conn, host, port):
            conn.resolving = f"{host}:{port}"
        else:
            log.warning("peer %s:%d: not resolved, too many names resolving at once", host, port)
            self.drop(conn)
        return _Channel(self, conn)

    def _resolved(self, conn: Conn, found: tcp_sockets.Answer) -> None:
        """A name's answer (``Resolver.take``): connect to its addresses, or drop ``conn``."""
        where, conn.resolving = conn.resolving, ""
        if conn.closed:
            return
        if isinstance(found, str):
            log.warning("peer %s: cannot resolve the address: %s", where, found)
            self.drop(conn)
            return
        conn.addresses = list(found)  # a copy: the resolver keeps its answer for others
        self._connect_next(conn)

    def _connect_next(self, conn: Conn) -> None:
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

    def add(self, conn: Conn) -> None:
        self._conns[conn.fd] = conn
        self._masks[conn.fd] = mask = _mask(conn)
        self._poller.register(conn.fd, mask)

    def drop(self, conn: Conn) -> None:
        """Close ``conn``; what it had queued is abandoned (its receipts are done)."""
        if conn.closed:
            return
        conn.closed = True
        conn.outgoing.abandon()
        if conn.listener is not None:
            conn.listener.discard(conn)
        self._forget_fd(conn)
        conn.sock.close()

    def _forget_fd(self, conn: Conn) -> None:
        if self._conns.pop(conn.fd, None) is not None:
            self._masks.pop(conn.fd, None)
            self._poller.unregister(conn.fd)

    def unlisten(self, listener: TcpListener) -> None:
        if self._listeners.pop(listener.fd, None) is not None:
            self._masks.pop(listener.fd, None)
            self._poller.unregister(listener.fd)
            listener.sock.close()

    def flush(self, conn: Conn) -> None:
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
        for waiting, found in self._resolver.take():
            assert isinstance(waiting, Conn)
            self._resolved(waiting, found)

    def _on_events(self, conn: Conn, events: int) -> None:
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

    def _remask(self, conn: Conn) -> None:
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
        for conn in [*self._conns.values(), *self._resolver.waiting()]:
            assert isinstance(conn, Conn)
            self.drop(conn)
        self._wakes.close()


def _mask(conn: Conn) -> int:
    """What to poll ``conn`` for: its connect, its replies (unless too many wait), writability
    while bytes wait."""
    if conn.connecting:
        return _OUT
    return (0 if conn.backlogged else _IN) | (_OUT if conn.outgoing.pending else 0)
