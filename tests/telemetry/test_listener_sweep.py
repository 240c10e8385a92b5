"""kvtier's own listeners from outside: the ``/metrics`` + admin endpoint and the KV event
publisher of a real ``TieringManager``, and ``kvtier events`` against hostile publishers.

Real sockets on 127.0.0.1. Waits are generous deadlines (a thread join, a poll): no test
asserts how long anything takes, only that it ends and what it answered.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from kvtier import TieringManager
from kvtier.cli.events import MAX_FRAME_BYTES
from kvtier.errors import InvalidArgumentError
from kvtier.keys import ChunkKey
from kvtier.telemetry.kv_events import EventKind, KVEvent, encode_batch
from tests.cli.test_cli_hostile import read_stderr_line
from tests.conftest import config
from tests.control.test_admin import free_port

CLI = [sys.executable, "-m", "kvtier.cli"]
DEADLINE_S = 30.0


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on a new connection, end it, and read the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as conn:
        with contextlib.suppress(OSError):  # answered and closed before all was sent
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := conn.recv(65536):
                answer += chunk
        return answer


def status(answer: bytes) -> int:
    """The status code of an HTTP/1.x answer (0 for anything else: HTTP/0.9, nothing)."""
    line = answer.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/1.") else 0


def body(answer: bytes) -> dict[str, object]:
    parsed: dict[str, object] = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    return parsed


@pytest.fixture
def served(identity, tmp_path) -> Iterator[tuple[TieringManager, int]]:
    """A manager with ``/metrics``, the admin endpoint and a tier ``fs``; and its port."""
    port = free_port()
    tiers = [{"type": "fs", "root_dir": str(tmp_path)}]
    cfg = config(2, secondary_tiers=tiers, metrics_port=port, metrics_admin=True)
    with TieringManager(cfg, identity) as m:
        yield m, port


# -- admin reasons ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reason", ["a%0A2026-12-07%20CRITICAL%20forged", "a%0Db", "%1B%5B31mred", "tab%09bed", ""]
)
def test_a_reason_with_a_control_character_or_empty_is_refused_and_switches_nothing(served, reason):
    """A reason is logged as it is: a newline in one would forge log lines."""
    m, port = served
    answer = exchange(
        port, f"POST /admin/tiers/fs/disable?reason={reason} HTTP/1.0\r\n\r\n".encode()
    )
    assert status(answer) == 400 and "reason" in str(body(answer)["error"])
    assert m.tier_states() == (["fs"], []) and m.take_tier_switches() == []


def test_the_manager_refuses_a_reason_with_a_control_character(served):
    m, _ = served
    with pytest.raises(InvalidArgumentError, match="printable"):
        m.disable_tier("fs", "line\nbreak")
    assert m.tier_states() == (["fs"], [])
    assert m.disable_tier("fs", "caf\u00e9 maintenance") is True  # printable beyond ASCII


# -- odd requests -----------------------------------------------------------------------------

ODD_REQUESTS = [
    (b"GET /metrics\r\n\r\n", 0),  # HTTP/0.9: the body alone
    (b"\x00\xff\xfe garbage\r\n\r\n", 0),
    (b"GET /metrics HTTP/9.9\r\n\r\n", 0),
    (b"FOO /metrics HTTP/1.1\r\n\r\n", 405),
    (b"GET /../../etc/passwd HTTP/1.1\r\n\r\n", 404),
    (b"POST /admin/tiers/../tiers/fs/disable HTTP/1.1\r\n\r\n", 404),
    (b"POST /admin/tiers/fs%2Fx/disable HTTP/1.1\r\n\r\n", 404),
    (b"POST /admin/tiers/fs%00/disable HTTP/1.1\r\n\r\n", 404),
    (b"POST http://127.0.0.1/admin/tiers/fs/disable HTTP/1.1\r\n\r\n", 404),
    (b"POST /admin/tiers/fs/disable HTTP/1.1\r\nHost: [\r\n\r\n", 403),
    (b"POST /admin/tiers/fs/disable HTTP/1.1\r\nHost: \r\n\r\n", 403),
    (b"POST /admin/tiers/fs/disable?" + b"&".join(b"a=%d" % i for i in range(99)) + b" HTTP/1.1\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n", 431),
    (b"POST /admin/tiers/fs/disable HTTP/1.1\r\nContent-Length: 100000000\r\n\r\nabc", 200),
    (b"POST /admin/tiers/fs/disable HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", 200),
    (b"\r\n\r\n", 0),
]  # fmt: skip


@pytest.mark.parametrize(("request_bytes", "expected"), ODD_REQUESTS)
def test_odd_requests_get_an_answer_or_a_close_and_the_endpoint_goes_on(
    served, request_bytes, expected
):
    m, port = served
    assert status(exchange(port, request_bytes)) == expected
    switched = m.tier_states() != (["fs"], [])
    assert switched == (expected == 200), "only a well-formed admin switch switches"
    assert status(exchange(port, b"GET /metrics HTTP/1.0\r\n\r\n")) == 200


def test_every_order_of_switches_ends_in_the_last_one_asked(served):
    m, port = served
    actions = ["disable", "disable", "enable", "enable", "disable", "enable", "disable"]
    for action in actions:
        answer = exchange(port, f"POST /admin/tiers/fs/{action} HTTP/1.0\r\n\r\n".encode())
        assert status(answer) == 200
    assert m.tier_states() == ([], ["fs"])
    assert [s.enabled for s in m.take_tier_switches()] == [False, True, False, True, False]


def test_500_clients_at_once_with_lying_or_endless_bodies_are_all_answered(served):
    """Bodies are never read: a POST whose body does not end holds no thread. The server
    answers before the body has arrived and closes with it unread, so such a client may see
    a reset instead of its answer (0); every scrape is answered."""
    m, port = served
    scrape = b"GET /metrics HTTP/1.0\r\n\r\n"
    post = b"POST /admin/tiers/nope/enable HTTP/1.0\r\nContent-Length: 9999999\r\n\r\n"
    answers: list[int] = []

    def client(i: int) -> None:
        answer = exchange(port, scrape if i % 2 else post + b"y" * 100_000)
        answers.append(status(answer))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(500)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
    assert not any(t.is_alive() for t in threads)
    assert len(answers) == 500 and answers.count(200) == 250
    assert set(answers) <= {0, 200, 404} and 404 in answers
    assert m.tier_states() == (["fs"], [])


# -- shutdown ---------------------------------------------------------------------------------


def test_close_with_clients_connected_returns_and_frees_both_ports(identity):
    """Idle, half-sent and stalled HTTP clients and zmq subscribers do not hold ``close`` up,
    and a new manager binds the same ports at once."""
    zmq = pytest.importorskip("zmq")
    port, events_port = free_port(), free_port()
    endpoint = f"tcp://127.0.0.1:{events_port}"
    cfg = config(2, metrics_port=port, metrics_admin=True, kv_events={"endpoint": endpoint})
    m = TieringManager(cfg, identity)
    context = zmq.Context()
    clients = [socket.create_connection(("127.0.0.1", p), timeout=DEADLINE_S) for p in
               (port, port, events_port)]  # fmt: skip
    clients[1].sendall(b"GET /metrics HTTP/1.1\r\nX-Half: ")
    for _ in range(3):
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.subscribe(b"")
        sub.connect(endpoint)
    try:
        closer = threading.Thread(target=m.close)
        closer.start()
        closer.join(DEADLINE_S)
        assert not closer.is_alive(), "close() waited for connected clients"
        with TieringManager(cfg, identity) as again:
            assert status(exchange(port, b"GET /metrics HTTP/1.0\r\n\r\n")) == 200
            assert again.tier_states() == ([], [])
    finally:
        for client in clients:
            client.close()
        context.destroy(linger=0)


# -- kvtier events against hostile publishers -------------------------------------------------


@contextlib.contextmanager
def hostile_publisher(timeout_s: float) -> Iterator[tuple[object, subprocess.Popen[bytes]]]:
    """An XPUB socket (it hears every subscription, repeated ones too) and ``kvtier events``
    subscribed to it, once the subscription has arrived."""
    zmq = pytest.importorskip("zmq")
    context = zmq.Context()
    publisher = context.socket(zmq.XPUB)
    publisher.setsockopt(zmq.LINGER, 0)
    publisher.setsockopt(zmq.XPUB_VERBOSE, 1)
    publisher.bind("tcp://127.0.0.1:*")
    endpoint = publisher.getsockopt_string(zmq.LAST_ENDPOINT)
    printer = subprocess.Popen(
        [*CLI, "events", "--connect", endpoint, "--timeout", str(timeout_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert publisher.poll(60_000), "the subscription never arrived"
        publisher.recv()
        assert read_stderr_line(printer, 60) == f"kvtier events: subscribed to {endpoint}\n"
        yield publisher, printer
    finally:
        printer.kill()
        printer.communicate()
        context.destroy(linger=0)


def good_batch() -> bytes:
    key = ChunkKey(bytes(range(32)))
    return encode_batch([KVEvent(0, EventKind.STORED, key, "accelerator", "host")], 4, 1.0)


def subscribed_again(publisher) -> bool:
    """Whether a subscription arrives within ``DEADLINE_S`` (unsubscriptions are skipped: the
    dropped connection's comes first)."""
    while publisher.poll(int(DEADLINE_S * 1000)):
        if publisher.recv().startswith(b"\x01"):
            return True
    return False


def test_kvtier_events_drops_a_frame_over_its_bound_unread_and_goes_on():
    """A frame over ``MAX_FRAME_BYTES`` drops the connection before libzmq buffers it whole
    (one frame of 2 GiB would have taken 2 GiB); the command connects again and goes on."""
    with hostile_publisher(5) as (publisher, printer):
        publisher.send_multipart([b"", (0).to_bytes(8, "big"), b"\xc1" * (MAX_FRAME_BYTES + 1)])
        resubscribed = subscribed_again(publisher)
        publisher.send_multipart([b"", (1).to_bytes(8, "big"), good_batch()])
        out, err = printer.communicate(timeout=120)
    assert printer.returncode == 0 and b"Traceback" not in err
    assert b"malformed batch 0" not in err, "the oversized frame was read whole"
    assert resubscribed, "the command did not connect again"
    assert out.decode().splitlines()[0].startswith("#0 stored")


@pytest.mark.parametrize(
    "payload",
    [b"\xdd\xff\xff\xff\xff", b"\x91" * 100_000, b"\x92\x01\x91\x92\x01\x02",
     b"\x92\x01\x91\x81\xa4type\x81\x01\x02", b"\x92\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00\x90"],
)  # fmt: skip
def test_kvtier_events_skips_msgpack_of_the_wrong_shape_and_goes_on(payload):
    """A huge array header, deep nesting, events that are not maps, a map as the type."""
    with hostile_publisher(3) as (publisher, printer):
        publisher.send_multipart([b"", (0).to_bytes(8, "big"), payload])
        publisher.send_multipart([b"", (1).to_bytes(8, "big"), good_batch()])
        out, err = printer.communicate(timeout=120)
    assert printer.returncode == 0 and b"Traceback" not in err
    assert out.decode().splitlines()[-1].startswith("#0 stored")


def test_kvtier_events_gives_up_on_an_endpoint_that_accepts_and_says_nothing():
    with socket.create_server(("127.0.0.1", 0)) as silent:
        endpoint = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        done = subprocess.run(
            [*CLI, "events", "--connect", endpoint, "--timeout", "1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"kvtier events: no publisher answered at {endpoint} within 1 s\n"


# -- the KV event publisher's connections -----------------------------------------------------

#: A ZMTP 3.0 greeting (NULL mechanism, as a client) and a READY command naming a SUB socket:
#: after these libzmq keeps a connection for good (it cuts off only unfinished handshakes).
ZMTP_GREETING = b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"NULL" + bytes(16) + bytes(32)
ZMTP_READY = b"\x04\x19\x05READY\x0bSocket-Type" + (3).to_bytes(4, "big") + b"SUB"


def sent_to_the_end(sock: socket.socket) -> bool:
    """Read what waits on ``sock`` without blocking; whether the server has closed it."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    return True


def test_subscribers_beyond_the_bound_are_cut_off_so_file_descriptors_stay_bounded(identity):
    """Each connection to the KV event port is a descriptor of the serving process: without a
    bound, a local process could take them all (the engine then opens no file)."""
    from kvtier.telemetry.kv_events import MAX_SUBSCRIBERS
    from kvtier.tiers.peer.connection_bounds import SUPPORTED

    if not SUPPORTED:
        pytest.skip("connections are bounded on Linux only (TCP_INFO)")
    port, surplus = free_port(), 40
    cfg = config(2, kv_events={"endpoint": f"tcp://127.0.0.1:{port}"})
    with TieringManager(cfg, identity):
        socks = [socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
                 for _ in range(MAX_SUBSCRIBERS + surplus)]  # fmt: skip
        try:
            for sock in socks:
                sock.sendall(ZMTP_GREETING + ZMTP_READY)
            open_ = list(socks)
            deadline = threading.Event()
            timer = threading.Timer(DEADLINE_S, deadline.set)
            timer.start()
            while len(open_) > MAX_SUBSCRIBERS and not deadline.is_set():
                ready, _, _ = select.select(open_, [], [], 0.2)
                open_ = [s for s in open_ if s not in ready or not sent_to_the_end(s)]
            timer.cancel()
            assert len(open_) <= MAX_SUBSCRIBERS, "connections beyond the bound stay open"
        finally:
            for sock in socks:
                sock.close()
