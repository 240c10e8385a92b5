"""ConnectionBounds: bounds what one TCP connection can make a listener's libzmq buffer.

libzmq hands a message to the application only once its last frame has arrived, and bounds only
the size of each frame (``MAXMSGSIZE``) and the number of *whole* messages queued (``RCVHWM``).
The frames of a message that never ends ("more" on every frame), or of one with a million empty
frames, pile up inside libzmq where the application cannot see them; measured: one such client
took a server from 231 MB to 1.7 GB. So the guard watches every connection from outside libzmq:

* ``pending``: the bytes libzmq has read from the connection (``TCP_INFO`` ``bytes_received``,
  less what still waits in the kernel, ``FIONREAD``) since a message from it was last delivered
  to the application (the listener names the connection of each message by ``ZMQ_SRCFD``). A
  connection whose ``pending`` passes ``limit_bytes`` is shut down; libzmq then drops its
  unfinished message and frees it. The listener sets ``limit_bytes`` to what its queue of whole
  messages plus one more may take, so an honest client is never cut off.
* connections beyond ``max_connections`` are shut down at once.

Wire bytes understate libzmq's memory for tiny frames (an empty frame costs 2 bytes on the wire
and about 64 in libzmq), so the bound on memory per connection is about 32 times ``limit_bytes``.

The guard runs a thread of its own, so that it keeps up with libzmq's I/O thread whatever the
listener's thread is doing: it learns connections from the socket monitor (``ACCEPTED``) and
keeps a duplicate of each connection's descriptor, polls them, and checks a connection when bytes
arrive on it (at most every ``RECHECK_S``), and every connection every ``SWEEP_S``. Through the
duplicate it reads and shuts down that very connection even after libzmq closed the number and
reused it; a connection libzmq let go of (its number closed or naming another file) is
forgotten. Linux only (``TCP_INFO``); elsewhere the guard watches nothing.

Thread safety: ``delivered`` and ``drop`` may be called from any thread (a lock guards the
table); the monitor socket belongs to the guard's thread until ``close`` has joined it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import struct
import termios
import threading
import time
from collections import Counter
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger(__name__)

RECHECK_S, SWEEP_S, POLL_S = 0.002, 1.0, 0.1
MAX_CONNECTIONS = 1024
ABORT_READS = 64  # at most 64 MiB of queued bytes discarded when a connection is cut off
_TCP_INFO_BYTES, _BYTES_RECEIVED_AT = 256, 128  # struct tcp_info: tcpi_bytes_received (Linux 4.1+)
SUPPORTED = hasattr(socket, "TCP_INFO")


@dataclass
class _Connection:
    sock: socket.socket  # a duplicate of libzmq's descriptor: the same TCP connection
    inode: int
    mark: int = 0  # bytes libzmq had read when a message from it was last delivered
    delivered: bool = False


class ConnectionBounds:
    """Watches the connections of one router socket; see the module docstring."""

    def __init__(
        self,
        monitor: zmq.Socket[bytes],
        limit_bytes: int,
        counters: Counter[str],
        max_connections: int = MAX_CONNECTIONS,
        owner: str = "peer server",
    ) -> None:
        """``owner`` names the listener in log lines and the guard's thread."""
        self.limit_bytes, self._monitor, self._owner = limit_bytes, monitor, owner
        self._counters, self._max_connections = counters, max_connections
        self._connections: dict[int, _Connection] = {}
        self._closing: list[socket.socket] = []  # duplicates to close once no longer polled
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._blind = not SUPPORTED  # deliveries cannot be told apart: never cut a runaway
        thread_name = f"kvtier-{owner.replace(' ', '-')}-guard"
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    # -- any thread --------------------------------------------------------------------------
    def delivered(self, fd: int) -> None:
        """A whole message from connection ``fd`` (``-1``: unknown) reached the application."""
        with self._lock:
            if fd < 0 and not self._blind:
                self._blind = True
                log.warning(
                    "%s: libzmq does not name connections (ZMQ_SRCFD); "
                    "unfinished messages are not bounded",
                    self._owner,
                )
            connection = self._connections.get(fd)
            if connection is not None:
                connection.delivered = True

    def drop(self, fd: int, reason: str) -> None:
        """Shut connection ``fd`` down (libzmq then closes it and drops what it buffered).

        A connection the guard has not learnt of yet (its monitor event is still on its way)
        is reached through its number, which names it as long as libzmq keeps it open.
        """
        with self._lock:
            connection = self._connections.pop(fd, None)
            sock = connection.sock if connection is not None else _duplicate(fd)
            if sock is None:
                return
            self._counters[f"connections_dropped_{reason}"] += 1
            _abort(sock)
            self._closing.append(sock)

    def close(self) -> None:
        """Stop and join the guard's thread; the caller then closes the monitor socket."""
        self._stop.set()
        self._thread.join()
        with self._lock:
            for sock in [*self._closing, *(c.sock for c in self._connections.values())]:
                sock.close()
            self._closing.clear()
            self._connections.clear()

    # -- the guard's thread ------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._monitor, zmq.POLLIN)
        polled: dict[int, int] = {}  # duplicate descriptor -> libzmq's number
        next_sweep = 0.0
        while not self._stop.is_set():
            ready = dict(poller.poll(int(POLL_S * 1000)))
            new = self._accept() if ready.pop(self._monitor, None) else []
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + SWEEP_S
                with self._lock:
                    due = list(self._connections)
            else:  # new ones at once: they may have sent a lot before we heard of them
                due = new + [polled[d] for d in ready if d in polled]
            for fd in due:
                self._check(fd)
            polled = self._repoll(poller, polled)
            if ready:
                self._stop.wait(RECHECK_S)  # readiness stays while libzmq reads: do not spin

    def _repoll(self, poller: zmq.Poller, polled: dict[int, int]) -> dict[int, int]:
        """Poll exactly the duplicates of the connections watched now; close the others."""
        with self._lock:
            watched = {c.sock.fileno(): fd for fd, c in self._connections.items()}
            closing, self._closing = self._closing, []
        for stale in polled.keys() - watched.keys():
            poller.unregister(stale)
        for sock in closing:
            sock.close()
        for new in watched.keys() - polled.keys():
            poller.register(new, zmq.POLLIN)
        return watched

    def _accept(self) -> list[int]:
        """Watch the connections accepted since the last call; their descriptors."""
        accepted = []
        while self._monitor.poll(0):
            event = parse_monitor_message(self._monitor.recv_multipart())
            if event["event"] == zmq.EVENT_ACCEPTED and SUPPORTED:
                fd = int(event["value"])
                accepted += [fd] if self._watch(fd) else []
        return accepted

    def _watch(self, fd: int) -> bool:
        sock = _duplicate(fd)
        if sock is None:
            return False
        with self._lock:
            old = self._connections.pop(fd, None)
            if old is not None:
                self._closing.append(old.sock)
            self._connections[fd] = _Connection(sock, os.fstat(sock.fileno()).st_ino)
            crowded = len(self._connections) > self._max_connections
        if crowded:
            self.drop(fd, "too_many")
        return not crowded

    def _check(self, fd: int) -> None:
        """Forget ``fd`` if libzmq let go of it; cut it off if its pending bytes are too many."""
        with self._lock:
            connection = self._connections.get(fd)
            if connection is None:
                return
            try:
                alive = os.fstat(fd).st_ino == connection.inode
                read = _bytes_read(connection.sock) if alive else None
            except OSError:
                alive, read = False, None
            if not alive:  # libzmq closed it (its number may name another file now)
                del self._connections[fd]
                self._closing.append(connection.sock)
                return
            if read is None or self._blind:
                return  # the kernel or libzmq does not say: never cut a connection off blindly
            if connection.delivered:
                connection.mark, connection.delivered = read, False
                return
            pending = read - connection.mark
        if pending > self.limit_bytes:
            log.warning(
                "%s: dropped a connection that sent %d bytes without ending a message",
                self._owner,
                pending,
            )
            self.drop(fd, "runaway")


def _duplicate(fd: int) -> socket.socket | None:
    """A socket on a duplicate of descriptor ``fd``; ``None`` if it is closed or not a socket."""
    if fd < 0:
        return None
    try:
        duplicate = os.dup(fd)
    except OSError:
        return None  # closed again before we looked
    try:
        return socket.socket(fileno=duplicate)
    except OSError:  # the number names another file by now
        os.close(duplicate)
        return None


def _abort(sock: socket.socket) -> None:
    """End the connection and discard what the kernel still holds of it.

    After a shutdown the kernel still hands queued bytes to libzmq, which could then finish the
    very message the connection was cut off for: those bytes are taken here instead.
    """
    with contextlib.suppress(OSError):  # already gone
        sock.shutdown(socket.SHUT_RDWR)
    for _ in range(ABORT_READS):
        try:
            if not sock.recv(1 << 20, socket.MSG_DONTWAIT):
                return
        except OSError:  # nothing queued (EAGAIN), or gone
            return


def _bytes_read(sock: socket.socket) -> int | None:
    """Bytes the connection received that its reader (libzmq) has taken from the kernel."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
    if len(info) < _BYTES_RECEIVED_AT + 8:
        return None
    received: int = struct.unpack_from("=Q", info, _BYTES_RECEIVED_AT)[0]
    waiting = bytearray(4)
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, waiting)
    return received - int.from_bytes(waiting, "little", signed=True)
