"""Transports for the peer tier: frames between processes, behind a small interface.

The peer tier and the peer server use only ``Transport``, ``Channel`` and ``Listener``; a
transport moves lists of frames (buffers) and never looks inside them. ``ZmqTransport`` is the
TCP implementation: a DEALER per connected peer, one ROUTER per listener, ``copy=False`` both
ways (a payload frame is sent straight out of the caller's buffer, whose release is reported by a
``SendReceipt``; received frames are views of ZeroMQ's own message buffers, or land in a buffer
the receiver chose with a ``Place``). An RDMA transport (UCX, NIXL) implements the same three
protocols.

CURVE (``CurveClient``/``CurveServer``) encrypts and authenticates: a listener with a
``CurveServer`` admits only clients whose public key is in ``allowed``; the handshake of any
other client fails inside ZeroMQ and never reaches the listener.

Bounds: every socket refuses frames longer than its ``max_frame_bytes`` plus
``FRAME_MARGIN_BYTES`` (the sender is disconnected by libzmq; the margin covers CURVE, which
carries each frame in a MESSAGE command 33 bytes longer). A listener also takes its
``MessageLimits``: at most ``RECV_QUEUE_MESSAGES`` whole messages queued per connection, a
``ConnectionGuard`` that cuts off a connection whose unfinished message grows past what that
queue may hold, and a receive loop that takes a message frame by frame and drops (without
keeping its frames) one with too many frames or bytes, disconnecting its sender.

Thread safety: a transport and everything it created belong to one thread (ZeroMQ sockets are
not thread-safe), except ``wake``, which any thread may call.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import zmq
from zmq.auth.thread import ThreadAuthenticator

from kvtier.config.file_modes import DEFAULT_DIR_MODE, DEFAULT_FILE_MODE, make_dirs
from kvtier.errors import ConfigError

if TYPE_CHECKING:
    from kvtier.tiers.peer.zmq_listener import ZmqListener

log = logging.getLogger(__name__)

#: Whole messages a listener queues per connection before libzmq stops reading from it.
RECV_QUEUE_MESSAGES = 4
#: Room above a socket's largest frame: CURVE adds 33 bytes per frame (a MESSAGE command: name 8,
#: nonce 8, flags 1, MAC 16), and libzmq checks its limit against that.
FRAME_MARGIN_BYTES = 256

Buffer = bytes | memoryview
#: ``place(i, frames)``: called before frame ``i >= 1`` of a message is received, with frames
#: ``0..i-1``; returns a writable buffer for frame ``i`` to land in, or ``None`` (the frame is then
#: received as usual). A landed frame comes back as that buffer cut to the frame's length; a frame
#: longer than its buffer is cut off and comes back empty.
Place = Callable[[int, Sequence[memoryview]], memoryview | None]


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
    def connect(self, host: str, port: int, max_frame_bytes: int) -> Channel: ...

    def listen(self, host: str, port: int, limits: MessageLimits) -> Listener: ...

    def wait(self, timeout_s: float) -> None:
        """Block until a channel or listener may have a message, ``wake`` is called, or timeout."""
        ...

    def wake(self) -> None: ...

    def close(self) -> None: ...


# -- CURVE keys -------------------------------------------------------------------------------
@dataclass(frozen=True)
class CurveClient:
    secret_key: bytes
    public_key: bytes
    server_key: bytes


@dataclass(frozen=True)
class CurveServer:
    secret_key: bytes
    public_key: bytes
    allowed: frozenset[bytes]


def write_keypair(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``NAME.public`` (mode 0644) and ``NAME.secret`` (mode 0600), Z85 text, into
    ``directory``, which is made (mode 0700, parents too) where missing.

    ``name`` is a file name, not a path (the caller checks it). Raises ``FileExistsError``
    naming the first key file that exists (nothing is written: a key is never overwritten),
    ``NotADirectoryError`` when ``directory`` is something else, another ``OSError`` when it
    cannot be made or written; on failure no key file is left behind.
    """
    folder = Path(directory)
    make_dirs(str(folder), DEFAULT_DIR_MODE)
    public_path, secret_path = folder / f"{name}.public", folder / f"{name}.secret"
    for path in (secret_path, public_path):
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "exists", str(path))
    public, secret = zmq.curve_keypair()
    _write_new(secret_path, secret + b"\n", DEFAULT_FILE_MODE)
    try:
        _write_new(public_path, public + b"\n", 0o644)
    except BaseException:
        secret_path.unlink(missing_ok=True)
        raise
    return public_path, secret_path


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` (never over an existing entry, never through a link) holding ``data``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def read_key(path: str | Path, what: str) -> bytes:
    """A Z85 CURVE key (40 characters) from a key file; ``ConfigError`` naming ``what``."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path} ({exc.strerror or exc})") from None
    if len(key) != 40:
        raise ConfigError(f"{what}: {path} does not hold a Z85 CURVE key (40 characters)")
    return key


def client_keys(secret_file: str, server_key_file: str) -> CurveClient:
    secret = read_key(secret_file, "curve_secret_key_file")
    server = read_key(server_key_file, "curve_server_key_file")
    return CurveClient(secret, zmq.curve_public(secret), server)


def server_keys(secret_file: str, client_keys_dir: str) -> CurveServer:
    secret = read_key(secret_file, "curve_secret_key_file")
    files = sorted(Path(client_keys_dir).glob("*.public"))
    if not files:
        raise ConfigError(f"curve_client_keys_dir: no *.public key files in {client_keys_dir}")
    allowed = frozenset(read_key(f, "curve_client_keys_dir") for f in files)
    return CurveServer(secret, zmq.curve_public(secret), allowed)


# -- ZeroMQ over TCP --------------------------------------------------------------------------
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
            frames.append(self._next_frame(place(len(frames), frames) if place else None))
            more = bool(self._socket.getsockopt(zmq.RCVMORE))
        return frames

    def _next_frame(self, landing: memoryview | None) -> memoryview:
        if landing is None:
            return self._socket.recv(copy=False).buffer
        size = self._socket.recv_into(landing)  # one copy, without the GIL
        return landing[:size] if size <= len(landing) else landing[:0]

    def close(self) -> None:
        self._transport.forget(self._socket)


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
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller.register(self._wake_r, zmq.POLLIN)

    def connect(self, host: str, port: int, max_frame_bytes: int) -> Channel:
        socket = self._socket(zmq.DEALER, max_frame_bytes)
        socket.setsockopt(zmq.RECONNECT_IVL, 100)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        if self._curve_client is not None:
            socket.curve_secretkey = self._curve_client.secret_key
            socket.curve_publickey = self._curve_client.public_key
            socket.curve_serverkey = self._curve_client.server_key
        socket.connect(f"tcp://{_bracket(host)}:{port}")
        return _Dealer(self, socket)

    def listen(self, host: str, port: int, limits: MessageLimits) -> Listener:
        socket = self._socket(zmq.ROUTER, limits.max_frame_bytes)
        socket.setsockopt(zmq.RCVHWM, RECV_QUEUE_MESSAGES)
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
        from kvtier.tiers.peer.zmq_listener import ZmqListener  # it imports this module's types

        listener = ZmqListener(socket, port, limits, monitor, self.forget)
        self._listeners.append(listener)
        return listener

    def _socket(self, kind: int, max_frame_bytes: int) -> zmq.Socket[bytes]:
        socket: zmq.Socket[bytes] = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes + FRAME_MARGIN_BYTES)  # else: dropped
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
        if dict(self._poller.poll(max(0, int(timeout_s * 1000)))).pop(self._wake_r, None):
            while True:
                try:
                    if not os.read(self._wake_r, 4096):
                        return
                except BlockingIOError:
                    return

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe: a wake-up is pending anyway
            os.write(self._wake_w, b"w")

    def close(self) -> None:
        for listener in list(self._listeners):
            listener.close()
        for socket in list(self._sockets):
            self.forget(socket)
        if self._auth is not None:
            self._auth.stop()
        self._context.term()
        os.close(self._wake_r)
        os.close(self._wake_w)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host
