"""The plain-TCP transport against hostile peers (real sockets, real processes where it
matters), from a review that attacked its first version. Each docstring tells the fault that
version had, and the behaviour the project's rules require ("never serve wrong KV, never hang,
never use unbounded memory": a failure ends in a miss or a dropped connection with a counter).
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from kvtier import CacheIdentity
from kvtier.config import P2PTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.peer import protocol as proto
from kvtier.tiers.peer import tcp_listener
from kvtier.tiers.peer.tcp_transport import TcpListener, TcpTransport
from kvtier.tiers.peer.tcp_wire import GREETING
from kvtier.tiers.peer.tier import PeerTier
from kvtier.tiers.peer.transport import MessageLimits
from tests.conftest import SMALL_LAYOUT, make_keys
from tests.tiers.peer_node import PeerNode, rss_mib

LIMITS = MessageLimits(max_frame_bytes=1000, max_frames=4, max_message_bytes=2000)


def message(*frames: bytes) -> bytes:
    prefix = struct.pack("<I", len(frames)) + struct.pack(f"<{len(frames)}Q", *map(len, frames))
    return prefix + b"".join(frames)


def next_message(
    transport: TcpTransport, listener: TcpListener, timeout: float = 5.0
) -> tuple[bytes, list[memoryview], bytes | None]:
    deadline = time.monotonic() + timeout
    while (got := listener.recv()) is None:
        assert time.monotonic() < deadline, "no message arrived"
        transport.wait(0.005)
    return got


def reset(sock: socket.socket) -> None:
    """Close ``sock`` with an RST (SO_LINGER 0), as a crashed or hostile client does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


# -- 1. a reply that fails to send leaves a dead connection in the listener -------------------
def test_a_connection_that_fails_while_its_reply_is_sent_is_forgotten(monkeypatch):
    """A client sends a request and resets its connection before the reply goes out (it
    crashed; or it times this on purpose). ``TcpListener.send`` then gets ECONNRESET/EPIPE and
    ``TcpTransport.drop`` closes the socket, but the listener keeps the dead ``_Conn`` in its
    table: nothing polls it any more, it is not ``ready`` and not unfinished, so neither
    ``recv`` nor the stalled sweep ever removes it. Each one counts against ``MAX_CONNECTIONS``
    for ever; once 1024 have piled up every new client is refused
    (``connections_dropped_over_limit``): the server is dead to all peers.

    Correct: a connection the transport dropped leaves the listener's table too (counted), so
    a new client is still accepted and served.
    """
    monkeypatch.setattr(tcp_listener, "MAX_CONNECTIONS", 2)
    server = TcpTransport()
    listener = server.listen("127.0.0.1", 0, LIMITS)
    honest: socket.socket | None = None
    try:
        for _ in range(2):
            sock = socket.create_connection(("127.0.0.1", listener.port))
            sock.sendall(GREETING + message(b"request"))
            peer, _, _ = next_message(server, listener)
            assert listener.recv() is None  # the request was taken; nothing else waits
            reset(sock)
            time.sleep(0.05)  # the RST has arrived; the server thread has not polled yet
            assert listener.send(peer, [b"reply"]).done  # the connection is gone
        for _ in range(20):
            server.wait(0.005)
            listener.recv()
        honest = socket.create_connection(("127.0.0.1", listener.port))
        honest.sendall(GREETING + message(b"honest"))
        deadline = time.monotonic() + 2
        got = None
        while got is None and time.monotonic() < deadline:
            server.wait(0.005)
            got = listener.recv()
        assert "connections_dropped_over_limit" not in listener.stats(), (
            "dead connections still count against MAX_CONNECTIONS"
        )
        assert got is not None and bytes(got[1][0]) == b"honest"
    finally:
        if honest is not None:
            honest.close()
        server.close()


# -- 2. a client that never reads its replies -------------------------------------------------
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_client_that_never_reads_cannot_grow_the_servers_memory_without_bound():
    """A client handshakes, then sends FETCHes of 1024 stored keys (35 KB each) and never
    reads a reply. Each reply carries 1024 freshly sealed 4 KiB headers (``server_seals``): 4 MiB
    of new memory per 35 KB request, queued in the connection's ``Outgoing`` with no bound (the
    hold budget and its stall bound the *slots*, not this queue; LOOKUP replies queue too). 40
    requests (1.4 MB sent) grew the serving process by about 180 MiB, and it stays so for as
    long as the client keeps the connection open: a few MB/s of requests exhausts the server's
    memory.

    Correct: what is queued for one connection is bounded (ZeroMQ's ROUTER drops replies past
    its send high-water mark): past the bound the server stops reading that client's requests
    or drops the connection with a counter, so 40 such requests cost well under 64 MiB.
    """
    node = PeerNode(0, "--store", "1024", "--slots", "1024", "--transport", "tcp").start()
    sock: socket.socket | None = None
    try:
        identity = CacheIdentity(model="test/model", revision="r1", layout=SMALL_LAYOUT)
        keys = make_keys(identity, 1024)
        assert node._proc is not None
        pid = node._proc.pid
        sock = socket.create_connection(("127.0.0.1", node.port))
        sock.sendall(GREETING + message(proto.hello(1, identity.digest)))
        sock.settimeout(5)
        assert sock.recv(8) == GREETING  # and the hello reply follows; we stop reading now
        time.sleep(0.5)
        before = rss_mib(pid)
        request = message(proto.keyed(proto.FETCH, 2, keys))
        for _ in range(40):
            sock.sendall(request)
        time.sleep(2.0)  # the server answers them all
        grown = rss_mib(pid) - before
        assert grown < 64, f"one non-reading client grew the server by {grown} MiB"
    finally:
        if sock is not None:
            sock.close()
        node.kill()


# -- 3. a server that floods a client with small valid messages ---------------------------------
FLOODER = r"""
import socket, struct
import msgpack
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
meta = msgpack.packb([2, 1 << 40, []])  # a LOOKUP reply for a request nobody sent
block = (struct.pack("<IQ", 1, len(meta)) + meta) * 50000
conn.sendall(b"KVTIER\x01\x00")
while True:
    conn.sendall(block)
"""


@pytest.fixture
def flooder() -> Iterator[subprocess.Popen[bytes]]:
    """A process that greets its one client, then sends small valid messages without end;
    ``proc.port`` is its port."""
    proc = subprocess.Popen([sys.executable, "-c", FLOODER], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        proc.port = int(proc.stdout.readline())  # type: ignore[attr-defined]
        yield proc
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_server_flooding_small_messages_costs_a_miss_not_a_hang(flooder, identity):
    """The peer greets, then streams LOOKUP replies for requests nobody sent (each one is valid
    and counted ``stale_replies``) faster than the client decodes them. ``PeerLink.receive``
    loops ``while`` the channel has a message, so the tier's I/O thread never leaves it: no
    ``tick`` (no handshake or request timeout), no commands drained (the load is never even
    sent), no other peer served. With ``timeout_s`` 0.3 the load had no result after 5 s
    (300 000+ stale replies counted meanwhile), and ``close`` waits as long as the flood lasts.

    Correct: a turn takes a bounded number of messages per link, so timeouts still fire: the
    load fails (a miss) within about ``timeout_s``, and the link is dropped and retried.
    """
    region = HostRegion(2, identity.layout.chunk_bytes)
    p2p = P2PTierConfig(host="127.0.0.1", port=flooder.port, transport="tcp", timeout_s=0.3)
    tier = PeerTier(p2p, region, identity)
    try:
        tier.submit_load(TransferJob(1, tuple(make_keys(identity, 1)), (0,)))
        deadline, results = time.monotonic() + 5, []
        while not results and time.monotonic() < deadline:
            results = tier.get_finished_jobs()
            time.sleep(0.01)
        stale = tier.stats().get("stale_replies", 0)
        assert results, f"no result after 5 s (timeout_s 0.3; {stale} stale replies taken)"
        assert not results[0].ok
    finally:
        flooder.kill()  # the flood ends first: else close() waits for the stuck I/O thread
        flooder.wait()
        tier.close()


# -- 4. a host name whose first address does not answer ----------------------------------------
def test_a_host_name_whose_first_address_refuses_still_connects_to_the_next(monkeypatch):
    """``localhost`` resolves to ``::1`` first and ``127.0.0.1`` second on many systems
    (RHEL/Fedora ``/etc/hosts``, macOS), while a server binds ``127.0.0.1`` by default.
    ``_resolve`` keeps only the first address, so the connection is refused and every retry
    tries that same address: the peer is a miss for ever (ZeroMQ, IPv4-only by default,
    connects).

    Correct: the channel tries the resolved addresses in turn (as ``create_connection`` does)
    and connects through the one that answers.
    """
    server, client = TcpTransport(), TcpTransport()
    try:
        listener = server.listen("127.0.0.1", 0, LIMITS)
        port = listener.port
        real = socket.getaddrinfo

        def dual_stack(host, *args, **kwargs):
            if host != "dual.test":
                return real(host, *args, **kwargs)
            if len(args) >= 5 and args[4] & socket.AI_NUMERICHOST:
                raise socket.gaierror(socket.EAI_NONAME, "not numeric")
            stream, tcp = socket.SOCK_STREAM, socket.IPPROTO_TCP
            return [
                (socket.AF_INET6, stream, tcp, "", ("::1", port, 0, 0)),
                (socket.AF_INET, stream, tcp, "", ("127.0.0.1", port)),
            ]

        monkeypatch.setattr(socket, "getaddrinfo", dual_stack)
        channel = client.connect("dual.test", port, LIMITS)
        sent = channel.send([b"hello"])
        deadline = time.monotonic() + 3
        got = None
        while got is None and time.monotonic() < deadline:
            client.wait(0.005)
            server.wait(0.005)
            got = listener.recv()
        assert sent and got is not None, "the second address was never tried"
    finally:
        client.close()
        server.close()
