"""TcpListener: the listening side of ``TcpTransport``, and the bounds on what it keeps.

A listener keeps at most ``MAX_CONNECTIONS``: a new one then displaces the connection heard
from longest ago, if it has been quiet both ways (no whole message from it, no byte written to
it) for ``DISPLACE_QUIET_S`` (``connections_displaced_quiet``), so that clients that connect
and say nothing cannot hold every place; otherwise the new one is closed at once
(``connections_dropped_over_limit``). It drops a connection that breaks the wire format or its
``MessageLimits`` (``connections_dropped_<reason>``), one whose greeting or unfinished message
is older than ``UNFINISHED_S`` (``connections_dropped_stalled``), and one that has not taken a
byte of its replies for as long (``connections_dropped_slow_reader``): what a client sends is
held one message at a time, and never for long.

Thread safety: none; a listener belongs to the thread that owns its transport.
"""

from __future__ import annotations

import itertools
import logging
import socket
import time
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from kvtier.tiers.peer.tcp_conn import Conn
from kvtier.tiers.peer.tcp_sockets import nonblocking
from kvtier.tiers.peer.tcp_wire import Closed, Receipt, Violation, encode
from kvtier.tiers.peer.transport import Buffer, MessageLimits, SendReceipt

log = logging.getLogger("kvtier.tiers.peer.tcp_transport")

MAX_CONNECTIONS = 1024
UNFINISHED_S = 30.0
#: How long a connection must have been quiet before a new one may take its place at the limit:
#: long beside a kvtier client's gaps between requests under load, short beside how long a
#: place would otherwise be held (for ever).
DISPLACE_QUIET_S = 10.0
SWEEP_S = 0.1  # how often a listener looks for stalled connections
ACCEPT_PAUSE_S = 0.5  # a listener that failed to accept (EMFILE) rests this long


class Owner(Protocol):
    """The transport that owns a listener's connections (``TcpTransport``)."""

    def add(self, conn: Conn) -> None: ...

    def drop(self, conn: Conn) -> None: ...

    def flush(self, conn: Conn) -> None: ...

    def unlisten(self, listener: TcpListener) -> None: ...


class TcpListener:
    """``Listener`` on one port; see the module docstring."""

    def __init__(self, transport: Owner, sock: socket.socket, limits: MessageLimits):
        self.port: int = sock.getsockname()[1]
        self.sock, self.fd = sock, sock.fileno()
        self._transport, self._limits = transport, limits
        self._conns: dict[bytes, Conn] = {}
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
            conn = Conn(sock, self._limits, b"tcp:%d" % next(self._ids), self)
            self._conns[conn.peer] = conn
            self._transport.add(conn)

    def _displace_quiet(self) -> bool:
        """Close the connection heard from longest ago (the first in ``_conns``: ``recv``
        moves each to the end as a message comes), if it has been quiet both ways for
        ``DISPLACE_QUIET_S``; whether one was. One look, not a scan: a flood of connections
        at the limit costs no more than before."""
        quietest = next(iter(self._conns.values()), None)
        if quietest is None or time.monotonic() - quietest.last_active < DISPLACE_QUIET_S:
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

    def forget(self, conn: Conn) -> None:
        """Close ``conn``; it leaves this listener's table (``drop`` calls ``discard``)."""
        self._transport.drop(conn)

    def discard(self, conn: Conn) -> None:
        """``conn`` was closed (by the listener, or by a failed send): forget its entry."""
        self._conns.pop(conn.peer, None)

    def stats(self) -> dict[str, int]:
        return dict(self._counters)

    def close(self) -> None:
        for conn in list(self._conns.values()):
            self.forget(conn)
        self._transport.unlisten(self)
