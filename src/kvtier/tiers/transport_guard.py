"""ConnectionGuard: bounds what one TCP connection can make a listener's libzmq buffer.

libzmq hands a message to the application only once its last frame has arrived, and bounds only
the size of each frame (``MAXMSGSIZE``) and the number of *whole* messages queued (``RCVHWM``).
The frames of a message that never ends ("more" on every frame), or of one with a million empty
frames, pile up inside libzmq where the application cannot see them; measured: one such client
took a server from 231 MB to 1.7 GB. So the guard watches every connection from outside libzmq:

* ``pending``: the bytes libzmq has read from the connection (``TCP_INFO`` ``bytes_received``,
  less what still waits in the kernel, ``FIONREAD``) since a message from it was last delivered
  to the application (messages name their connection by ``ZMQ_SRCFD``). A connection whose
  ``pending`` passes ``limit_bytes`` is shut down; libzmq then drops its unfinished message and
  frees it. ``limit_bytes`` is what ``RCVHWM`` whole messages plus one more may take, so an honest
  client is never cut off, however slowly the application reads.
* connections beyond ``max_connections`` are shut down at once.

Wire bytes understate libzmq's memory for tiny frames (an empty frame costs 2 bytes on the wire
and about 64 in libzmq), so the bound on memory per connection is about 32 times ``limit_bytes``.

Connections are learnt from the socket monitor (``ACCEPTED``). The guard keeps a duplicate of
each connection's descriptor, so it reads and shuts down that very connection even after libzmq
closed the number and reused it; a connection libzmq let go of (its number closed or now naming
another file) is forgotten. Linux only (``TCP_INFO``); elsewhere the guard does nothing.

Thread safety: none; the guard belongs to the thread that owns the router socket.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import struct
import termios
import time
from collections import Counter
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger(__name__)

#: How often connections are checked while any is open.
CHECK_INTERVAL_S = 0.02
MAX_CONNECTIONS = 1024
_TCP_INFO_BYTES, _BYTES_RECEIVED_AT = 256, 128  # struct tcp_info: tcpi_bytes_received (Linux 4.1+)
SUPPORTED = hasattr(socket, "TCP_INFO")


@dataclass
class _Connection:
    sock: socket.socket  # a duplicate of libzmq's descriptor: the same TCP connection
    inode: int
    mark: int = 0  # bytes libzmq had read when a message from it was last delivered
    delivered: bool = False


class ConnectionGuard:
    """Watches the connections of one router socket; see the module docstring."""

    def __init__(
        self,
        monitor: zmq.Socket[bytes],
        limit_bytes: int,
        counters: Counter[str],
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.monitor, self.limit_bytes = monitor, limit_bytes
        self._counters, self._max_connections = counters, max_connections
        self._connections: dict[int, _Connection] = {}
        self._next_check = 0.0
        self._blind = not SUPPORTED  # cannot tell deliveries apart: never cut off a runaway

    @property
    def watching(self) -> bool:
        """Whether connections are open (the owner then calls ``tend`` every interval)."""
        return bool(self._connections)

    def delivered(self, fd: int) -> None:
        """A whole message from connection ``fd`` (``-1``: unknown) reached the application."""
        if fd < 0 and not self._blind:
            self._blind = True
            log.warning("peer server: libzmq does not name connections (ZMQ_SRCFD); "
                        "unfinished messages are not bounded")  # fmt: skip
        connection = self._connections.get(fd)
        if connection is not None:
            connection.delivered = True

    def tend(self, force: bool = False) -> None:
        """Learn new connections; check each at most every ``CHECK_INTERVAL_S`` (or now)."""
        self._accept()
        now = time.monotonic()
        if not SUPPORTED or (now < self._next_check and not force):
            return
        self._next_check = now + CHECK_INTERVAL_S
        for fd, connection in list(self._connections.items()):
            self._check(fd, connection)

    def drop(self, fd: int, reason: str) -> None:
        """Shut connection ``fd`` down (libzmq then closes it and drops what it buffered)."""
        connection = self._connections.pop(fd, None)
        if connection is None:
            return
        self._counters[f"connections_dropped_{reason}"] += 1
        with contextlib.suppress(OSError):  # already gone
            connection.sock.shutdown(socket.SHUT_RDWR)
        connection.sock.close()

    def close(self) -> None:
        for connection in self._connections.values():
            connection.sock.close()
        self._connections.clear()

    def _accept(self) -> None:
        while self.monitor.poll(0):
            event = parse_monitor_message(self.monitor.recv_multipart())
            if event["event"] == zmq.EVENT_ACCEPTED and SUPPORTED:
                self._watch(int(event["value"]))

    def _watch(self, fd: int) -> None:
        try:
            duplicate = os.dup(fd)
        except OSError:
            return  # closed again before we looked
        try:
            sock = socket.socket(fileno=duplicate)
        except OSError:  # the number names another file by now
            os.close(duplicate)
            return
        inode = os.fstat(sock.fileno()).st_ino
        old = self._connections.pop(fd, None)
        if old is not None:
            old.sock.close()
        self._connections[fd] = _Connection(sock, inode)
        if len(self._connections) > self._max_connections:
            self.drop(fd, "too_many")

    def _check(self, fd: int, connection: _Connection) -> None:
        try:
            alive = os.fstat(fd).st_ino == connection.inode
            read = _bytes_read(connection.sock) if alive else None
        except OSError:
            alive, read = False, None
        if not alive:  # libzmq closed it (its number may name another file now)
            del self._connections[fd]
            connection.sock.close()
        elif read is None or self._blind:
            return  # this kernel or libzmq does not say: never cut a connection off blindly
        elif connection.delivered:
            connection.mark, connection.delivered = read, False
        elif read - connection.mark > self.limit_bytes:
            log.warning(
                "peer server: dropped a connection that sent %d bytes without ending a message",
                read - connection.mark,
            )
            self.drop(fd, "runaway")


def _bytes_read(sock: socket.socket) -> int | None:
    """Bytes the connection received that its reader (libzmq) has taken from the kernel."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
    if len(info) < _BYTES_RECEIVED_AT + 8:
        return None
    received: int = struct.unpack_from("=Q", info, _BYTES_RECEIVED_AT)[0]
    waiting = bytearray(4)
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, waiting)
    return received - int.from_bytes(waiting, "little", signed=True)
