"""The metrics endpoint under idle, slow and surplus connections: bounded threads, still answers.

Every test runs a real ``MetricsServer`` on a loopback port and talks to it over real sockets.
Timeouts here are short (``timeout_s``) so that idle connections are dropped quickly; waits
are deadlines, never speed assertions.
"""

from __future__ import annotations

import contextlib
import math
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from kvtier.telemetry.endpoint import MetricsServer
from kvtier.telemetry.metrics import ManagerMetrics, TelemetryCollector

IDLE = 250
DEADLINE_S = 30.0


def registry() -> CollectorRegistry:
    """A registry with one manager's metrics, ``kvtier_lookups_total`` at 3."""
    metrics = ManagerMetrics()
    metrics.count("lookups", 3)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(TelemetryCollector(metrics.telemetry, {}))
    return reg


@contextlib.contextmanager
def serving(**options: float) -> Iterator[MetricsServer]:
    server = MetricsServer(registry(), 0, "127.0.0.1", **options)
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def idle_connections(port: int, n: int) -> Iterator[list[socket.socket]]:
    """``n`` connections that never send a byte, closed on exit."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S))
        yield socks
    finally:
        for sock in socks:
            sock.close()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def get(port: int, path: str = "/metrics", method: str = "GET") -> tuple[int, str]:
    """One request; retried while the server drops it for being full. Returns (status, body)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:  # closed at once: the pool and its queue were full
            assert time.monotonic() < deadline, "the metrics endpoint never answered"
            time.sleep(0.05)


def server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kvtier-metrics")]


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` without answering (EOF or reset)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_idle_connections_keep_the_thread_count_bounded_and_metrics_still_answer():
    baseline = threading.active_count()
    with serving(timeout_s=0.5) as server, idle_connections(server.port, IDLE):
        status, text = get(server.port)  # accepted after every idle one, so all were accepted
        assert status == 200
        assert "kvtier_lookups_total 3.0" in text
        assert "# TYPE kvtier_lookups_total counter" in text
        assert threading.active_count() < baseline + 16


def test_close_returns_with_idle_connections_open_and_joins_every_thread():
    baseline = threading.active_count()
    server = MetricsServer(registry(), 0, workers=4, max_connections=12, timeout_s=3600)
    assert server_threads()
    with idle_connections(server.port, 40):
        wait_for(lambda: server.stats()["dropped"] >= 40 - 12, "the surplus to be dropped")
        closer = threading.Thread(target=server.close)
        closer.start()
        closer.join(DEADLINE_S)
        assert not closer.is_alive(), "close() waited for idle connections"
    assert server_threads() == []
    assert threading.active_count() <= baseline


def test_connections_over_the_limit_close_the_oldest_idle_ones_and_count_them():
    with (
        serving(workers=1, max_connections=2, timeout_s=3600) as server,
        idle_connections(server.port, 5) as socks,
    ):
        wait_for(lambda: server.stats()["limit"] >= 3, "three connections to be dropped")
        for sock in socks[:3]:
            assert select.select([sock], [], [], DEADLINE_S)[0] and closed_by_server(sock)
        assert select.select(socks[3:], [], [], 0.2)[0] == [], "the newest two stay open"
        assert server.stats()["open"] == 2


def test_a_request_head_sent_too_slowly_is_cut_off():
    with serving(timeout_s=0.5) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE_S)
        with sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
            deadline = time.monotonic() + DEADLINE_S
            while True:  # a header line every 50 ms: each read succeeds, the whole never ends
                assert time.monotonic() < deadline, "the slow request was never cut off"
                ready, _, _ = select.select([sock], [], [], 0.05)
                if ready:
                    assert closed_by_server(sock)
                    break
                try:
                    sock.sendall(b"X-Slow: 1\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    break
        wait_for(lambda: server.stats()["read_deadline"] >= 1, "the slow request to be counted")


def test_an_oversized_request_head_is_refused():
    with serving(timeout_s=5) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE_S)
        with sock:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 65536)
            assert closed_by_server(sock)
        assert get(server.port)[0] == 200


def test_only_get_on_metrics_or_root_is_served():
    with serving() as server:
        status, text = get(server.port, "/")
        assert status == 200 and "kvtier_lookups_total" in text
        assert get(server.port, "/metrics?name[]=kvtier_lookups_total")[0] == 200
        assert get(server.port, "/other")[0] == 404
        assert get(server.port, "/metrics", method="POST")[0] == 405
        wait_for(lambda: server.stats()["served"] == 4, "four answers to be counted")


@pytest.mark.parametrize(
    "options",
    [{"workers": 0}, {"max_connections": 0}, {"timeout_s": 0}, {"timeout_s": math.nan},
     {"timeout_s": math.inf}],
)  # fmt: skip
def test_bad_bounds_are_refused(options):
    with pytest.raises(ValueError):
        MetricsServer(registry(), 0, **options)
    assert server_threads() == []
