"""Conn: one connection of ``TcpTransport``, a client's or one a ``TcpListener`` accepted.

Thread safety: none; a connection belongs to the thread that owns its transport.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Protocol

from kvtier.tiers.peer.protocol import MAX_IN_FLIGHT
from kvtier.tiers.peer.tcp_wire import GREETING, Incoming, Outgoing
from kvtier.tiers.peer.transport import MessageLimits, Place

#: Replies queued for one connection at most, as many as a kvtier client has requests out: then
#: its requests are left unread, and a reply past it is dropped (``replies_dropped_backlog``), so
#: a peer that does not read cannot make the server queue more.
MAX_QUEUED_REPLIES = MAX_IN_FLIGHT


class Accepted(Protocol):
    """What accepted a connection (a ``TcpListener``): told when the transport drops it."""

    def discard(self, conn: Conn) -> None: ...


class Conn:
    """One TCP connection: its socket, what it is receiving, what waits to be written."""

    def __init__(
        self,
        sock: socket.socket,
        limits: MessageLimits,
        peer: bytes = b"",
        listener: Accepted | None = None,
    ) -> None:
        self.sock, self.peer, self.fd, self.listener = sock, peer, sock.fileno(), listener
        self.incoming, self.outgoing = Incoming(limits), Outgoing()
        self.outgoing.put([memoryview(GREETING)])
        self.connecting = self.closed = self.ready = False
        self.resolving = ""  # "host:port" while its name is looked up
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

    @property
    def last_active(self) -> float:
        """When it last gave a whole message, or its socket took bytes for it."""
        return max(self.heard_at, self.outgoing.moved_at)
