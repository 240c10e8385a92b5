"""The ``/metrics`` HTTP endpoint: a fixed pool of handler threads, whatever the clients do.

``prometheus_client.start_http_server`` starts a thread per connection, so idle connections
alone could grow a process by a thread each. ``MetricsServer`` bounds everything instead:

- one *accept thread* (``kvtier-metrics-accept``) accepts connections and puts them on a queue
  of at most ``backlog`` entries; when the queue is full it closes the new connection at once
  and counts it as ``dropped``;
- ``workers`` *pool threads* (``kvtier-metrics-N``) take connections off the queue and answer
  one request each (HTTP/1.0, no keep-alive) with ``prometheus_client.make_wsgi_app``;
- a connection must deliver its whole request head within ``timeout_s`` of being accepted
  (idle and slowloris clients are cut off and counted as ``aborted``), and the response must
  be sent within ``timeout_s`` after that.

So the threads are exactly ``1 + workers``, at most ``workers + backlog`` connections are open
on the server side, and each lives at most about ``2 * timeout_s``. Only ``GET /metrics`` and
``GET /`` are answered (other paths 404, other methods 405).

prometheus-client (the ``metrics`` extra) is imported only when a server is built.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import queue
import re
import socket
import threading
import time
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from kvtier.telemetry.logs import ThrottledLog

if TYPE_CHECKING:
    from collections.abc import Iterable
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

    from _typeshed import ReadableBuffer

log = logging.getLogger(__name__)
_throttled = ThrottledLog(log)

#: Paths answered with the metrics; any other path is a 404.
SERVED_PATHS = ("/metrics", "/")
#: Longest request head (request line and headers) read before the connection is dropped.
HEAD_LIMIT = 16384
#: Seconds a connection has to send its request head, and again to take the answer.
DEFAULT_TIMEOUT_S = 5.0
#: Seconds between checks of the accept loop for ``close``.
POLL_INTERVAL_S = 0.1

_HEAD_END = re.compile(rb"\r?\n\r?\n")

_Item = tuple[socket.socket, Any, float]  # connection, client address, deadline for its head


class HeadTooLarge(ValueError):
    """A request head longer than ``HEAD_LIMIT`` bytes."""


def read_head(conn: socket.socket, deadline: float, limit: int = HEAD_LIMIT) -> bytes:
    """Read one request head, through its blank line, from ``conn`` before ``deadline``.

    ``deadline`` is on the ``time.monotonic`` clock. Returns the bytes read, which end with or
    contain the blank line (anything the client sent after it is included). Raises
    ``TimeoutError`` when the deadline passes first, however steadily bytes trickle in,
    ``ConnectionError`` when the client closes first, and ``HeadTooLarge`` past ``limit`` bytes.
    Runs on a pool thread; changes ``conn``'s timeout.
    """
    buf = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("request head not complete before the deadline")
        conn.settimeout(remaining)
        chunk = conn.recv(limit + 1 - len(buf))
        if not chunk:
            raise ConnectionError("client closed before the request head ended")
        start = max(0, len(buf) - 3)
        buf += chunk
        if _HEAD_END.search(buf, start):
            return bytes(buf)
        if len(buf) > limit:
            raise HeadTooLarge(f"request head longer than {limit} bytes")


class _DeadlineWriter(io.BufferedIOBase):
    """A write-only file over a socket; every write must be sent before one deadline."""

    def __init__(self, conn: socket.socket, deadline: float) -> None:
        super().__init__()
        self._conn, self._deadline = conn, deadline

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer, /) -> int:
        """Send all of ``data`` or raise (``TimeoutError`` once the deadline has passed)."""
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("response not sent before the deadline")
        self._conn.settimeout(remaining)
        self._conn.sendall(data)  # its timeout bounds the whole call, not each send
        return memoryview(data).nbytes


def only_metrics_paths(
    app: WSGIApplication, admin: WSGIApplication | None = None
) -> WSGIApplication:
    """``app`` for the paths in ``SERVED_PATHS``, ``admin`` (if any) for ``/admin/...``; 404
    for every other path."""

    def serve(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if admin is not None and str(environ.get("PATH_INFO", "")).startswith("/admin/"):
            answer: Iterable[bytes] = admin(environ, start_response)
            return answer
        if environ.get("PATH_INFO") not in SERVED_PATHS:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: metrics are on /metrics\n"]
        result: Iterable[bytes] = app(environ, start_response)
        return result

    return serve


class _PooledServer(WSGIServer):
    """A ``WSGIServer`` whose accept loop feeds a bounded queue instead of starting threads.

    ``process_request`` runs on the accept thread; everything else here is set up before the
    threads start.
    """

    request_queue_size = 128  # the kernel's listen queue: sockets, not threads; absorbs bursts

    def __init__(self, address: tuple[str, int], family: int, backlog: int, timeout: float) -> None:
        self.address_family = family
        self.request_timeout = timeout
        self.queue: queue.Queue[_Item | None] = queue.Queue(backlog)
        self.dropped = 0  # written by the accept thread only
        super().__init__(address, _Request)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Queue the connection with its head deadline, or close it at once when full."""
        try:
            item = (request, client_address, time.monotonic() + self.request_timeout)
            self.queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            self.shutdown_request(request)
            msg = "metrics endpoint full: closed a new connection at once (%d so far)"
            _throttled.warning("metrics_full", msg, self.dropped)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("metrics: error accepting from %s", client_address, exc_info=True)


class _Request(WSGIRequestHandler):
    """Answers one request on a pool thread, within the deadlines of its connection.

    Built by ``MetricsServer`` with the connection's head ``deadline``; without one (the
    ``socketserver`` signature) the head has ``request_timeout`` from now.
    """

    def __init__(
        self, request: Any, client_address: Any, server: Any, deadline: float | None = None
    ) -> None:
        self.deadline = deadline
        super().__init__(request, client_address, server)

    def setup(self) -> None:
        """Read the whole head before the deadline, then answer with a deadline of its own."""
        server = self.server
        timeout = server.request_timeout if isinstance(server, _PooledServer) else DEFAULT_TIMEOUT_S
        deadline = self.deadline if self.deadline is not None else time.monotonic() + timeout
        self.connection = self.request
        self.rfile = io.BytesIO(read_head(self.connection, deadline))
        self.wfile = _DeadlineWriter(self.connection, time.monotonic() + timeout)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics: %s " + format, self.address_string(), *args)


class MetricsServer:
    """Serves ``/metrics`` for a registry over HTTP, on ``1 + workers`` threads, until ``close``.

    ``port`` 0 picks a free port (read it from ``self.port``). ``host`` is bound as given
    (IPv4 or IPv6). ``workers`` requests are answered at once, ``backlog`` more connections
    wait, and new ones beyond that are closed at once. A connection has ``timeout_s`` seconds
    from being accepted to send its request head, and as long again to take the answer.
    ``admin`` (``kvtier.control.admin``), when given, answers the ``/admin/...`` paths.
    Raises ``ValueError`` for bounds out of range and ``OSError`` when it cannot bind; it then
    leaves no thread or socket behind.

    Thread safety: ``stats`` and ``close`` may be called from any thread.
    """

    def __init__(
        self,
        registry: Any,
        port: int,
        host: str = "127.0.0.1",
        *,
        workers: int = 4,
        backlog: int = 8,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        admin: WSGIApplication | None = None,
    ) -> None:
        from prometheus_client import make_wsgi_app

        _check_bounds(workers, backlog, timeout_s)
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        self._server = _PooledServer((host, port), family[0][0], backlog, timeout_s)
        self._server.set_app(only_metrics_paths(make_wsgi_app(registry), admin))
        self.port: int = self._server.server_address[1]
        self._lock = threading.Lock()
        self._active: set[socket.socket] = set()
        self._closing = False
        self._counts = {"served": 0, "aborted": 0}
        self._threads = [
            threading.Thread(target=self._work, name=f"kvtier-metrics-{i}", daemon=True)
            for i in range(workers)
        ]
        self._threads.append(
            threading.Thread(
                target=self._server.serve_forever,
                args=(POLL_INTERVAL_S,),
                name="kvtier-metrics-accept",
                daemon=True,
            )
        )
        for thread in self._threads:
            thread.start()

    def stats(self) -> dict[str, int]:
        """Connections so far: ``served`` (answered), ``aborted`` (timed out, reset, too
        large, or cut off by ``close``) and ``dropped`` (closed at once, the server was full)."""
        with self._lock:
            return {**self._counts, "dropped": self._server.dropped}

    def close(self) -> None:
        """Stop accepting, cut off every open connection, and join every thread.

        Returns without waiting for idle clients or their timeouts (within about
        ``POLL_INTERVAL_S``). A second call returns at once.
        """
        with self._lock:
            if self._closing:
                return
            self._closing = True
            for conn in self._active:  # wakes the pool thread blocked on it
                _cut_off(conn)
        self._server.shutdown()  # the accept thread leaves serve_forever
        self._server.server_close()
        for _ in range(len(self._threads) - 1):
            self._server.queue.put(None)  # blocks while full, but the pool is draining it
        for thread in self._threads:
            thread.join()

    def _work(self) -> None:
        """A pool thread: answer queued connections until the ``None`` that ``close`` sends."""
        while (item := self._server.queue.get()) is not None:
            self._serve(*item)

    def _serve(self, conn: socket.socket, client_address: Any, deadline: float) -> None:
        """Answer one connection on this pool thread and close it; count how it ended."""
        outcome = "aborted"
        try:
            if self._claim(conn):
                _Request(conn, client_address, self._server, deadline)
                outcome = "served"
        except (OSError, ValueError) as exc:  # timed out, reset, head too large, or close()
            log.debug("metrics: connection from %s cut off: %r", client_address, exc)
        except Exception:
            log.warning("metrics: answering %s failed", client_address, exc_info=True)
        finally:
            with self._lock:
                self._active.discard(conn)
                self._counts[outcome] += 1
            self._server.shutdown_request(conn)

    def _claim(self, conn: socket.socket) -> bool:
        """Register ``conn`` so that ``close`` can cut it off; False once closing."""
        with self._lock:
            if not self._closing:
                self._active.add(conn)
            return not self._closing


def _cut_off(conn: socket.socket) -> None:
    """Shut ``conn`` down both ways, waking any thread blocked reading or writing it."""
    with contextlib.suppress(OSError):  # already gone
        conn.shutdown(socket.SHUT_RDWR)


def _check_bounds(workers: int, backlog: int, timeout_s: float) -> None:
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    if backlog < 1:
        raise ValueError(f"backlog must be at least 1, not {backlog}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive finite number, not {timeout_s}")
