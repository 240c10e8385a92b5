"""ZmqTransport: the peer tier's ``Transport`` over ZeroMQ and TCP (see ``transport``).

A DEALER per connected peer, one ROUTER per listener (``zmq_listener``), ``copy=False`` both
ways; CURVE through ``curve_keys``.

Thread safety: a transport and everything it created belong to one thread (ZeroMQ sockets are
not thread-safe), except ``wake``, which any thread may call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import zmq
from zmq.auth.thread import ThreadAuthenticator

from kvtier.errors import ConfigError
from kvtier.tiers.peer.curve_keys import CurveClient, CurveServer
from kvtier.tiers.peer.protocol import MAX_IN_FLIGHT
from kvtier.tiers.peer.transport import (
    FRAME_MARGIN_BYTES,
    KEEPALIVE_IDLE_S,
    KEEPALIVE_INTERVAL_S,
    KEEPALIVE_PROBES,
    RECV_QUEUE_MESSAGES,
    Buffer,
    Channel,
    Landing,
    Listener,
    MessageLimits,
    Place,
    landing,
)
from kvtier.tiers.peer.wake_pipe import WakePipe
from kvtier.tiers.peer.zmq_listener import ZmqListener

log = logging.getLogger(__name__)


#: Replies a listener queues for one client: twice as many as a kvtier client has requests out,
#: because libzmq learns that queued replies left only some at a time (it counts every
#: (hwm + 1) // 2 taken), so a queue of exactly that many drops honest clients' replies.
SEND_QUEUE_MESSAGES = 2 * MAX_IN_FLIGHT


class _Dealer:
    def __init__(self, transport: ZmqTransport, socket: zmq.Socket[bytes]) -> None:
        self._transport, self._socket = transport, socket

    def send(self, frames: Sequence[Buffer]) -> bool:
        try:
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True

    def recv(self, place: Place | None = None) -> list[memoryview] | None:
        try:
            first = self._socket.recv(flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        frames = [first.buffer]
        more = first.more  # ZeroMQ delivers a message whole: its other frames are here already
        while more:
            frames.append(self._next_frame(landing(place(len(frames), frames)) if place else None))
            more = bool(self._socket.getsockopt(zmq.RCVMORE))
        return frames

    def _next_frame(self, land: Landing | None) -> memoryview:
        if land is None:
            return self._socket.recv(copy=False).buffer
        if land.copy_in is not None:
            return self._copied_in(land, land.copy_in)
        size = self._socket.recv_into(land.buffer)  # one copy, without the GIL
        if size > len(land.buffer):
            return land.buffer[:0]
        if land.feed is not None:
            land.feed(size)
        return land.buffer[:size]

    def _copied_in(self, land: Landing, copy_in: Callable[[Buffer], object]) -> memoryview:
        """The next frame, copied into ``land.buffer`` and checksummed in one pass, without the
        GIL (libzmq received it whole into its own buffer). Against a copy then a checksum, in
        alternating rounds through one tier: 1.085x [1.065, 1.124] the throughput at 8 MiB,
        where the slot no longer sits in cache when it is hashed; no difference shown at 2 MiB
        (``benchmarks/payload_passes.py``)."""
        frame = self._socket.recv(copy=False).buffer
        try:
            copy_in(frame)  # refuses a frame longer than the buffer, changing nothing
        except ValueError:
            return land.buffer[:0]
        return land.buffer[: len(frame)]

    def close(self) -> None:
        self._transport.forget(self._socket)


class _Unreachable:
    """The channel of an address that cannot be connected to: sends fail, nothing arrives."""

    def send(self, frames: Sequence[Buffer]) -> bool:
        return False

    def recv(self, place: Place | None = None) -> list[memoryview] | None:
        return None

    def close(self) -> None:
        pass


class ZmqTransport:
    """ZeroMQ over TCP; see the module docstring. Owns its context and every socket in it."""

    def __init__(
        self, *, curve_client: CurveClient | None = None, curve_server: CurveServer | None = None
    ) -> None:
        self._context = zmq.Context()
        self._poller = zmq.Poller()
        self._sockets: list[zmq.Socket[bytes]] = []
        self._listeners: list[ZmqListener] = []
        self._curve_client, self._curve_server = curve_client, curve_server
        self._auth: ThreadAuthenticator | None = None
        self.num_refused_keys = 0
        self._wakes = WakePipe()
        self._poller.register(self._wakes.fd, zmq.POLLIN)

    def connect(self, host: str, port: int, limits: MessageLimits) -> Channel:
        """Only ``limits.max_frame_bytes`` is enforced (by libzmq), on every frame. An address
        libzmq refuses gives a closed channel (its sends fail), as an unresolved name does."""
        socket = self._socket(zmq.DEALER, limits.max_frame_bytes)
        socket.setsockopt(zmq.RECONNECT_IVL, 100)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        if self._curve_client is not None:
            socket.curve_secretkey = self._curve_client.secret_key
            socket.curve_publickey = self._curve_client.public_key
            socket.curve_serverkey = self._curve_client.server_key
        try:
            socket.connect(f"tcp://{_bracket(host)}:{port}")
        except zmq.ZMQError as exc:  # an address libzmq cannot parse: nothing to connect to
            log.warning("peer %s:%s: cannot connect (%s)", host, port, exc)
            self.forget(socket)
            return _Unreachable()
        return _Dealer(self, socket)

    def listen(self, host: str, port: int, limits: MessageLimits) -> Listener:
        socket = self._socket(zmq.ROUTER, limits.max_frame_bytes)
        socket.setsockopt(zmq.RCVHWM, RECV_QUEUE_MESSAGES)
        # A client that does not read gets ``SEND_QUEUE_MESSAGES`` replies queued; a reply past
        # them is dropped and counted (``ZmqListener.send``).
        socket.setsockopt(zmq.SNDHWM, SEND_QUEUE_MESSAGES)
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if self._curve_server is not None:
            self._start_auth(self._curve_server)
            socket.curve_server = True
            socket.curve_secretkey = self._curve_server.secret_key
            socket.curve_publickey = self._curve_server.public_key
        try:
            socket.bind(f"tcp://{_bracket(host)}:{port}")
        except zmq.ZMQError as exc:
            self.forget(socket)
            raise ConfigError(
                f"serve.host, serve.port: cannot listen on {host}:{port} ({exc})"
            ) from exc
        monitor: zmq.Socket[bytes] = socket.get_monitor_socket(zmq.EVENT_ACCEPTED)

        listener = ZmqListener(socket, port, limits, monitor, self.forget)
        self._listeners.append(listener)
        return listener

    def _socket(self, kind: int, max_frame_bytes: int) -> zmq.Socket[bytes]:
        socket: zmq.Socket[bytes] = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes + FRAME_MARGIN_BYTES)  # else: dropped
        socket.setsockopt(zmq.TCP_KEEPALIVE, 1)  # a peer vanished without closing is found
        socket.setsockopt(zmq.TCP_KEEPALIVE_IDLE, KEEPALIVE_IDLE_S)
        socket.setsockopt(zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_INTERVAL_S)
        socket.setsockopt(zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_PROBES)
        self._sockets.append(socket)
        self._poller.register(socket, zmq.POLLIN)
        return socket

    def _start_auth(self, keys: CurveServer) -> None:
        self._auth = ThreadAuthenticator(self._context, log=log.getChild("zap"))
        self._auth.start()
        self._auth.configure_curve_callback("*", credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP: admit a CURVE client only if its public key is on the allow-list."""
        assert self._curve_server is not None
        if key in self._curve_server.allowed:
            return True
        self.num_refused_keys += 1
        log.warning("peer server: refused a client whose CURVE key is not allowed (%s)", key[:8])
        return False

    def forget(self, socket: zmq.Socket[bytes]) -> None:
        self._poller.unregister(socket)
        self._sockets.remove(socket)
        self._listeners = [r for r in self._listeners if r.socket is not socket]
        socket.close(linger=0)

    def wait(self, timeout_s: float) -> None:
        if dict(self._poller.poll(max(0, int(timeout_s * 1000)))).pop(self._wakes.fd, None):
            self._wakes.drain()

    def wake(self) -> None:
        self._wakes.wake()

    def close(self) -> None:
        for listener in list(self._listeners):
            listener.close()
        for socket in list(self._sockets):
            self.forget(socket)
        if self._auth is not None:
            self._auth.stop()
        self._context.term()
        self._wakes.close()


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host
