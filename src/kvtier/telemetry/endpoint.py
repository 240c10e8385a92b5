"""The HTTP endpoint of ``/metrics`` and ``/admin/...``, bounded whatever the clients do.

A pool of threads that each read a request is held by idle clients (12 locked out a pool of
4), so ``MetricsServer`` reads requests on one thread and hands only complete ones on:

- the *I/O thread* (``kvtier-metrics-accept``) owns the listening socket and each connection
  until its request head has arrived: it accepts and reads without blocking (``selectors``:
  idle connections cost no thread), enforces the bounds below, and queues complete requests;
- ``workers`` *pool threads* (``kvtier-metrics-N``) answer one queued request each (HTTP/1.0,
  no keep-alive) with the WSGI app, and close the connection.

A connection a bound closes unanswered counts in ``kvtier_endpoint_connections_dropped_total``
under one ``reason``:

- ``read_deadline``: its whole request head did not arrive within ``timeout_s`` of the accept
  (idle, or trickling bytes: slowloris);
- ``limit``: at most ``max_connections`` are open. A new connection at the limit closes the
  *oldest one still sending its head*: a scraper sends its head at once, so it gets in while
  idle clients fill the limit, and the client that waited longest without a request is the
  likeliest never to send one. Only when every open connection has a complete request is the
  new one closed at once;
- ``fd_limit``: ``accept`` found no free file descriptor; the oldest connection still sending
  its head makes room (keep ``max_connections`` well below ``ulimit -n``);
- ``head_too_large``: a request head over ``HEAD_LIMIT`` bytes;
- ``write_deadline``: the answer was not taken within ``timeout_s`` of its head.

Only ``GET /metrics`` and ``GET /`` are answered (other paths 404, other methods 405), and
``/admin/...`` with an admin app. prometheus-client is imported only when a server is built.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import math
import queue
import re
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from kvtier.telemetry.logs import ThrottledLog
from kvtier.telemetry.metrics import ENDPOINT_DROP_REASONS as REASONS
from kvtier.telemetry.metrics import ENDPOINT_FAMILIES, Telemetry, TelemetryCollector

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
#: Connections open at once, by default (each is a file descriptor of the serving process).
DEFAULT_MAX_CONNECTIONS = 256
#: Seconds between the I/O thread's checks of deadlines and of ``close``.
POLL_INTERVAL_S = 0.1
#: Connections accepted in a row between reads: a fresh client's head is read before two more
#: batches come in, so with ``max_connections`` above two batches it is never the oldest.
ACCEPT_BATCH = 64

DROPPED, OPEN = (name for name, _, _ in ENDPOINT_FAMILIES)
_OUT_OF_FDS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_HEAD_END = re.compile(rb"\r?\n\r?\n")


@dataclass(eq=False)
class _Pending:
    """A connection and the request head read from it so far (by the I/O thread)."""

    conn: socket.socket
    address: Any
    deadline: float  # time.monotonic() by which the whole head must have arrived
    head: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes) -> bool:
        """Add ``chunk``; whether the head's blank line has arrived (what follows is kept)."""
        start = max(0, len(self.head) - 3)
        self.head += chunk
        return _HEAD_END.search(self.head, start) is not None


class _DeadlineWriter(io.BufferedIOBase):
    """A write-only file over a socket; every write must be sent before one deadline."""

    def __init__(self, conn: socket.socket, deadline: float) -> None:
        super().__init__()
        self._conn, self._deadline = conn, deadline
        self.expired = False  # a write ran out of time (wsgiref may swallow the error)

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer, /) -> int:
        """Send all of ``data`` or raise (``TimeoutError`` once the deadline has passed)."""
        try:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("response not sent before the deadline")
            self._conn.settimeout(remaining)
            self._conn.sendall(data)  # its timeout bounds the whole call, not each send
        except TimeoutError:
            self.expired = True
            raise
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


class _Listener(WSGIServer):
    """The listening socket (non-blocking) and the app; ``MetricsServer`` runs the loops."""

    request_queue_size = 128  # the kernel's listen queue: sockets, not threads; absorbs bursts

    def __init__(self, address: tuple[str, int], family: int) -> None:
        self.address_family = family
        super().__init__(address, WSGIRequestHandler)  # unused: MetricsServer builds _Request
        self.socket.setblocking(False)


class _Request(WSGIRequestHandler):
    """Answers one complete request on a pool thread; the answer has ``timeout_s`` to go."""

    def __init__(self, pending: _Pending, server: _Listener, timeout_s: float) -> None:
        self._head, self._timeout_s = bytes(pending.head), timeout_s
        super().__init__(pending.conn, pending.address, server)

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(self._head)
        self.writer = _DeadlineWriter(self.connection, time.monotonic() + self._timeout_s)
        self.wfile = self.writer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics: %s " + format, self.address_string(), *args)


class MetricsServer:
    """Serves ``/metrics`` for a registry over HTTP, on ``1 + workers`` threads, until ``close``.

    ``port`` 0 picks a free port (``self.port``); ``host`` is bound as given (IPv4 or IPv6).
    ``workers`` requests are answered at once, at most ``max_connections`` are open, and
    ``timeout_s`` is both the read and the write deadline (the module docstring says what is
    dropped when). ``admin`` (``kvtier.control.admin``), when given, answers ``/admin/...``.
    The endpoint's own metrics (``self.telemetry``) are exported on ``registry`` too. Raises
    ``ValueError`` for bounds out of range and ``OSError`` when it cannot bind, leaving no
    thread or socket.

    Thread safety: ``stats`` and ``close`` may be called from any thread.
    """

    def __init__(
        self,
        registry: Any,
        port: int,
        host: str = "127.0.0.1",
        *,
        workers: int = 4,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        admin: WSGIApplication | None = None,
    ) -> None:
        from prometheus_client import make_wsgi_app

        _check_bounds(workers, max_connections, timeout_s)
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        self._listener = _Listener((host, port), family[0][0])
        self._listener.set_app(only_metrics_paths(make_wsgi_app(registry), admin))
        self.port: int = self._listener.server_address[1]
        self.telemetry = _exported_telemetry(registry)
        self._limit, self._timeout_s, self._workers = max_connections, timeout_s, workers
        self._lock = threading.Lock()  # guards the next two lines
        self._open, self._closing, self._answering = 0, False, set[socket.socket]()
        self._counts = {"served": 0, "aborted": 0, **dict.fromkeys(REASONS, 0)}
        self._stop = threading.Event()
        self._pending: dict[socket.socket, _Pending] = {}  # the I/O thread's; oldest first
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener.socket, selectors.EVENT_READ)
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._threads = [_thread(self._work, f"kvtier-metrics-{i}") for i in range(workers)]
        self._threads.append(_thread(self._run, "kvtier-metrics-accept"))

    def stats(self) -> dict[str, int]:
        """Connections so far: ``served`` (answered), ``aborted`` (the client left or failed,
        or ``close`` cut it off), ``dropped`` (closed unanswered by a bound) and each drop
        reason on its own; now: ``open``, and ``reading`` (of those, still sending a head)."""
        with self._lock:
            dropped = sum(self._counts[r] for r in REASONS)
            now = {"dropped": dropped, "open": self._open, "reading": len(self._pending)}
            return {**self._counts, **now}  # len(): atomic, though the I/O thread owns it

    def close(self) -> None:
        """Stop accepting, cut off every open connection, and join every thread.

        Returns without waiting for idle clients or their deadlines (within about
        ``POLL_INTERVAL_S``). A second call returns at once.
        """
        with self._lock:
            if self._closing:
                return
            self._closing = True
            for conn in self._answering:  # wakes the pool thread blocked on it
                _cut_off(conn)
        self._stop.set()
        self._threads[-1].join()  # the I/O thread closes what it owns, the listener too
        for _ in range(self._workers):
            self._queue.put(None)
        for thread in self._threads:
            thread.join()

    def _run(self) -> None:
        """The I/O thread: accept, read heads, enforce the read deadline, until ``close``;
        then close the connections still sending a head, the selector and the listener."""
        while not self._stop.is_set():
            try:
                self._step()
            except Exception as exc:  # never leave the endpoint without its I/O thread
                _throttled.warning("metrics_loop", "metrics: I/O loop error: %r", exc)
        for pending in list(self._pending.values()):
            self._forget(pending, "aborted")
        self._selector.close()
        self._listener.server_close()

    def _step(self) -> None:
        """One round of the I/O thread (so are the methods up to ``_work``)."""
        for key, _ in self._selector.select(POLL_INTERVAL_S):
            if key.data is None:
                self._accept()
            elif key.data.conn in self._pending:  # not dropped earlier in this round
                self._read(key.data)
        now = time.monotonic()
        while self._pending and (oldest := next(iter(self._pending.values()))).deadline <= now:
            self._forget(oldest, "read_deadline")

    def _accept(self) -> None:
        """Accept up to ``ACCEPT_BATCH`` connections, making room under the limit for each."""
        for _ in range(ACCEPT_BATCH):
            try:
                conn, address = self._listener.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # the client gave up while queued
                continue
            except OSError as exc:
                self._out_of_fds(exc)
                return
            self._admit(conn, address)

    def _admit(self, conn: socket.socket, address: Any) -> None:
        # _open is read unlocked: only this thread raises it, so it is at most too high
        if self._open >= self._limit and not self._drop_oldest("limit"):
            self._end(conn, "limit", counted_open=False)  # every open one has a request
            return
        conn.setblocking(False)
        pending = _Pending(conn, address, time.monotonic() + self._timeout_s)
        self._pending[conn] = pending
        self._selector.register(conn, selectors.EVENT_READ, pending)
        with self._lock:
            self._open += 1
            self.telemetry.set(OPEN, self._open)

    def _out_of_fds(self, exc: OSError) -> None:
        if exc.errno not in _OUT_OF_FDS:
            log.debug("metrics: accept failed: %r", exc)
        elif not self._drop_oldest("fd_limit"):  # every descriptor carries a request
            self._stop.wait(POLL_INTERVAL_S)  # the workers free some meanwhile

    def _read(self, pending: _Pending) -> None:
        """Read what ``pending`` sent; hand it to the workers once its head is complete."""
        try:
            chunk = pending.conn.recv(HEAD_LIMIT + 1 - len(pending.head))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the client
            chunk = b""
        if not chunk:
            self._forget(pending, "aborted")  # the client left first
        elif pending.feed(chunk):
            self._forget(pending)
            self._queue.put(pending)
        elif len(pending.head) > HEAD_LIMIT:
            self._forget(pending, "head_too_large")

    def _drop_oldest(self, reason: str) -> bool:
        """Close the connection that has been sending its head longest; False if none is."""
        if not self._pending:
            return False
        self._forget(next(iter(self._pending.values())), reason)
        return True

    def _forget(self, pending: _Pending, outcome: str | None = None) -> None:
        """Stop reading ``pending``; close it too with an ``outcome`` (see ``_end``)."""
        del self._pending[pending.conn]
        self._selector.unregister(pending.conn)
        if outcome is not None:
            self._end(pending.conn, outcome)

    def _work(self) -> None:
        """A pool thread: answer complete requests off the queue until ``close`` sends None."""
        while (pending := self._queue.get()) is not None:
            self._end(pending.conn, self._answer(pending))

    def _answer(self, pending: _Pending) -> str:
        """Answer ``pending``'s request on this pool thread; how it ended (``stats`` keys)."""
        with self._lock:
            if self._closing:
                return "aborted"
            self._answering.add(pending.conn)
        try:
            request = _Request(pending, self._listener, self._timeout_s)
            return "write_deadline" if request.writer.expired else "served"
        except TimeoutError:
            return "write_deadline"
        except (OSError, ValueError) as exc:  # reset, or cut off by close()
            log.debug("metrics: connection from %s cut off: %r", pending.address, exc)
        except Exception:
            log.warning("metrics: answering %s failed", pending.address, exc_info=True)
        finally:
            with self._lock:
                self._answering.discard(pending.conn)
        return "aborted"

    def _end(self, conn: socket.socket, outcome: str, counted_open: bool = True) -> None:
        """Count how ``conn`` ended (``served``, ``aborted``, or a drop reason), then close it
        (either thread): a client that sees it closed sees it counted."""
        if outcome in REASONS:
            self.telemetry.inc(DROPPED, reason=outcome)
            msg = "metrics endpoint: closed a connection unanswered (%s)"
            _throttled.warning(f"metrics_{outcome}", msg, outcome)
        with self._lock:
            self._counts[outcome] += 1
            if counted_open:
                self._open -= 1
                self.telemetry.set(OPEN, self._open)
        self._listener.shutdown_request(conn)


def _exported_telemetry(registry: Any) -> Telemetry:
    """A ``Telemetry`` of the endpoint's families exported on ``registry``, every drop reason
    at 0 (so that rates start from the first scrape)."""
    telemetry = Telemetry()
    registry.register(TelemetryCollector(telemetry, {}))
    for name, kind, doc in ENDPOINT_FAMILIES:
        telemetry.declare(name, kind, doc)
    for reason in REASONS:
        telemetry.inc(DROPPED, 0, reason=reason)
    telemetry.set(OPEN, 0)
    return telemetry


def _thread(target: Any, name: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def _cut_off(conn: socket.socket) -> None:
    """Shut ``conn`` down both ways, waking any thread blocked reading or writing it."""
    with contextlib.suppress(OSError):  # already gone
        conn.shutdown(socket.SHUT_RDWR)


def _check_bounds(workers: int, max_connections: int, timeout_s: float) -> None:
    for name, value in (("workers", workers), ("max_connections", max_connections)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, not {value}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive finite number, not {timeout_s}")
