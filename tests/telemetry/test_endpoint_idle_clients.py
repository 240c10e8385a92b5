"""``/metrics`` and the admin endpoint keep answering under 1,000 idle or slowloris connections
(issue 25, finding 5: 12 idle connections locked both out, 2 of 11 calls answered).

Real sockets on 127.0.0.1, in this process: the clients, the real endpoint (a manager's, or a
``MetricsServer`` built with other bounds), and a real admin app. Every call is made once, with
a generous timeout, and must answer: no retries, and no wall-clock duration is asserted.
"""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtier.control.admin import admin_app
from kvtier.telemetry.endpoint import MetricsServer
from tests.control.test_admin import served  # noqa: F401 (a fixture: a manager, its port)
from tests.telemetry.test_metrics_http import closed_by_server, registry, wait_for

CLIENTS = 1000
CALLS = 11  # of each kind, as in the finding
DEFAULT_MAX_CONNECTIONS = 256  # as docs/operating.md says
CALL_TIMEOUT_S = 60.0
#: What a slowloris client trickles, a byte a second: header lines that never end the head.
TRICKLE = b"GET /metrics HTTP/1.1\r\nX-Slow: 1\r\n"


@pytest.fixture(autouse=True)
def enough_file_descriptors():
    """Room for both ends of every connection in this one process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 4 * CLIENTS
    if soft >= need:
        yield
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=CALL_TIMEOUT_S)


@contextlib.contextmanager
def idle(port: int, n: int = CLIENTS) -> Iterator[list[socket.socket]]:
    """``n`` connections that never send a byte, closed on exit."""
    socks: list[socket.socket] = []
    try:
        socks.extend(connect(port) for _ in range(n))
        yield socks
    finally:
        for sock in socks:
            sock.close()


def call(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    """One request, made once: its status and body (``OSError`` if it got no answer)."""
    url = f"http://127.0.0.1:{port}{path}"
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S) as answer:
        return answer.status, answer.read()


def every_call_answers(port: int, tier: str = "fs") -> None:
    """``CALLS`` scrapes, admin listings and admin switches, each answered at its first try."""
    for _ in range(CALLS):
        status, body = call(port, "/metrics")
        assert status == 200 and b"kvtier_endpoint_connections_dropped_total" in body
        assert call(port, "/admin/tiers")[0] == 200
        assert call(port, f"/admin/tiers/{tier}/disable", "POST")[0] == 200
        assert call(port, f"/admin/tiers/{tier}/enable", "POST")[0] == 200


def dropped(port: int) -> dict[str, float]:
    """``kvtier_endpoint_connections_dropped_total`` by reason, scraped."""
    text = call(port, "/metrics")[1].decode()
    family = "kvtier_endpoint_connections_dropped"
    samples = [
        s for f in text_string_to_metric_families(text) if f.name == family for s in f.samples
    ]
    return {s.labels["reason"]: s.value for s in samples if s.name.endswith("_total")}


class Slowloris:
    """``n`` clients that each send one header byte a second and never end their request head.

    While ``reconnect`` is set, a client the server closed connects again (as an attacker's
    would), so ``n`` keep pressing on the endpoint. Runs on a thread of its own until ``stop``.
    """

    def __init__(self, port: int, n: int = CLIENTS) -> None:
        self.port, self.reconnect = port, threading.Event()
        self.reconnect.set()
        self.socks: list[socket.socket | None] = [connect(port) for _ in range(n)]
        self.sent, self.reconnects = [0] * n, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slowloris", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for i in range(len(self.socks)):
                self._trickle(i)

    def _trickle(self, i: int) -> None:
        sock = self.socks[i]
        try:
            if sock is not None:
                sock.send(TRICKLE[self.sent[i] % len(TRICKLE) :][:1])
                self.sent[i] += 1
                return
        except OSError:  # the server closed it (the send after its FIN is reset)
            sock.close()
            self.socks[i] = None
        if self.reconnect.is_set():
            with contextlib.suppress(OSError):
                self.socks[i], self.sent[i] = connect(self.port), 0
                self.reconnects += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self.socks:
            if sock is not None:
                sock.close()


def test_every_call_answers_with_1000_idle_connections_at_the_default_bounds(served):  # noqa: F811
    m, port = served
    with idle(port):
        every_call_answers(port)
        counts = dropped(port)
        assert m.runtime.endpoint.stats()["open"] <= DEFAULT_MAX_CONNECTIONS
    assert counts["limit"] >= CLIENTS - DEFAULT_MAX_CONNECTIONS, counts


def test_every_call_answers_while_1000_slowloris_clients_trickle_and_reconnect(served):  # noqa: F811
    _, port = served
    attack = Slowloris(port)
    try:
        every_call_answers(port)
        wait_for(lambda: attack.reconnects >= CLIENTS, "the attack to come back")
        every_call_answers(port)  # while it goes on
        attack.reconnect.clear()  # those left open trickle on, until the read deadline
        wait_for(lambda: dropped(port)["read_deadline"] >= 1, "a slowloris client cut off")
        every_call_answers(port)
    finally:
        attack.stop()
    assert dropped(port)["limit"] >= 1


class Switches:
    """The admin endpoint's controls: one tier ``fs``; ``tier_states`` waits for ``go``."""

    def __init__(self) -> None:
        self.go, self.entered = threading.Event(), threading.Event()

    def tier_states(self) -> tuple[list[str], list[str]]:
        self.entered.set()
        assert self.go.wait(CALL_TIMEOUT_S)
        return ["fs"], []

    def disable_tier(self, name: str, reason: str = "manual") -> bool:
        return True

    def enable_tier(self, name: str) -> bool:
        return True


@contextlib.contextmanager
def endpoint(switches: Switches | None = None, **bounds: float) -> Iterator[MetricsServer]:
    if switches is None:
        switches = Switches()
        switches.go.set()
    server = MetricsServer(registry(), 0, "127.0.0.1", admin=admin_app(switches), **bounds)
    try:
        yield server
    finally:
        server.close()


def readable(socks: list[socket.socket], timeout: float) -> list[socket.socket]:
    """Which of ``socks`` have something to read (here: the server closed them)."""
    with selectors.DefaultSelector() as sel:  # select.select stops at descriptor 1024
        for sock in socks:
            sel.register(sock, selectors.EVENT_READ)
        return [key.fileobj for key, _ in sel.select(timeout)]  # type: ignore[misc]


def test_1000_idle_connections_held_open_cost_no_thread_and_no_answer():
    baseline = threading.active_count()
    with endpoint(max_connections=CLIENTS + 100, timeout_s=3600) as server, idle(server.port):
        wait_for(lambda: server.stats()["open"] == CLIENTS, "every idle connection accepted")
        every_call_answers(server.port)
        assert threading.active_count() <= baseline + 5  # the I/O thread and 4 workers
        answered = lambda: server.stats()["served"] == 4 * CALLS  # noqa: E731
        wait_for(answered, "the last answer counted")  # it reached the client first
        stats = server.stats()
    assert stats["open"] == CLIENTS and stats["dropped"] == 0, stats


def test_at_the_limit_nothing_is_dropped_and_one_over_drops_the_oldest_idle_one():
    limit = 50
    with (
        endpoint(max_connections=limit, timeout_s=3600) as server,
        idle(server.port, limit) as socks,
    ):
        wait_for(lambda: server.stats()["open"] == limit, "the connections to be accepted")
        assert readable(socks, 0.5) == [] and server.stats()["dropped"] == 0
        with idle(server.port, 1) as over:
            wait_for(lambda: server.stats()["limit"] == 1, "one connection dropped")
            assert readable(socks + over, CALL_TIMEOUT_S) == [socks[0]]
            assert closed_by_server(socks[0])
            assert server.stats()["open"] == limit
            assert call(server.port, "/metrics")[0] == 200  # the next oldest makes room
            assert readable(socks[1:2], CALL_TIMEOUT_S) == [socks[1]]
        wait_for(lambda: server.stats()["open"] == limit - 2, "the extra one's close seen")
        assert dropped(server.port)["limit"] == 2  # under the limit again: nothing dropped


def test_a_new_connection_is_closed_at_once_when_every_open_one_has_a_request():
    switches = Switches()
    with endpoint(switches, workers=1, max_connections=2) as server:
        answers: list[int] = []
        callers = [threading.Thread(target=admin_call, args=(server.port, answers)) for _ in "ab"]
        callers[0].start()
        assert switches.entered.wait(CALL_TIMEOUT_S)  # the one worker is busy with it
        callers[1].start()
        both_waiting = lambda: server.stats()["open"] == 2 and server.stats()["reading"] == 0  # noqa: E731
        wait_for(both_waiting, "the second request queued")
        with idle(server.port, 1) as (third,):
            assert readable([third], CALL_TIMEOUT_S) == [third] and closed_by_server(third)
        assert server.stats()["limit"] == 1
        switches.go.set()
        for caller in callers:
            caller.join(CALL_TIMEOUT_S)
        assert answers == [200, 200]


def admin_call(port: int, answers: list[int]) -> None:
    answers.append(call(port, "/admin/tiers")[0])
