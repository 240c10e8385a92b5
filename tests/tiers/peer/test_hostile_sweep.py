"""An adversarial sweep of the peer server and the p2p tier, over both transports.

Real sockets on 127.0.0.1: a serving manager in this process (its own driver thread answers)
and raw clients that speak the wire by hand (``RawZmq``, ``RawTcp``); a scripted server built on
a transport's own listener that answers a client's FETCH as each scenario says; a serving node
in a process of its own where memory is measured. Each case asserts what must hold whatever a
peer does: wrong KV is never loaded, nothing hangs, every failure is a miss with a counter, and
what one client sends or leaves unread bounds what the server keeps.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
import zmq

from kvtier import CacheIdentity, TieringManager
from kvtier.config import P2PTierConfig
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import HIT, TransferJob
from kvtier.tiers.peer import protocol as proto
from kvtier.tiers.peer.tcp_wire import GREETING
from kvtier.tiers.peer.tier import MAX_PEERS, PeerTier
from kvtier.tiers.peer.transport import MessageLimits
from kvtier.tiers.peer.transports import transport_for
from kvtier.tiers.shared import codec
from tests.conftest import (
    SMALL_LAYOUT,
    chunk_pattern,
    collect,
    config,
    fill,
    holds,
    make_keys,
    on_a_free_port,
    settle_lookup,
    wait_for,
)
from tests.tiers.peer.hostile_client import connect as zmtp_connect
from tests.tiers.peer_node import PeerNode, rss_mib

IDENTITY = CacheIdentity(model="test/model", revision="r1", layout=SMALL_LAYOUT)
OTHER = CacheIdentity(model="other/model", revision="r1", layout=SMALL_LAYOUT)
CHUNK = SMALL_LAYOUT.chunk_bytes
KEYS = make_keys(IDENTITY, 8)
TRANSPORTS = ["zmq", "tcp"]


# -- a serving manager, and raw clients ----------------------------------------------------------
class Served:
    """A manager serving ``KEYS`` over ``transport``; its own driver thread answers peers."""

    def __init__(self, transport: str, accept_stores: bool) -> None:
        def serving(port: int) -> TieringManager:
            serve = {"port": port, "accept_stores": accept_stores, "transport": transport}
            return TieringManager(config(32, serve=serve), IDENTITY)

        self.transport = transport
        self.manager, self.port = on_a_free_port(serving)
        plan = self.manager.prepare_store(KEYS)
        assert plan is not None
        for key, slot in zip(plan.keys, plan.slots, strict=True):
            fill(self.manager.region, slot, key)
        self.manager.complete_store(plan.keys)

    def stats(self) -> dict[str, int]:
        server = self.manager.peer_server
        assert server is not None
        return server.stats()

    def honest_load(self, n: int = 3) -> bool:
        """A kvtier client of this server loads ``KEYS[:n]`` byte-identical."""
        region = HostRegion(n, CHUNK)
        p2p = P2PTierConfig(host="127.0.0.1", port=self.port, transport=self.transport)
        tier = PeerTier(p2p, region, IDENTITY)  # type: ignore[arg-type]
        try:
            tier.submit_load(TransferJob(1, tuple(KEYS[:n]), tuple(range(n))))
            ok = collect(tier, [1], timeout=30)[1].ok
            return ok and all(holds(region, i, key) for i, key in enumerate(KEYS[:n]))
        finally:
            tier.close()


@pytest.fixture(scope="module", params=TRANSPORTS)
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    node = Served(request.param, accept_stores=True)
    yield node
    node.manager.close()


class RawZmq:
    """A bare DEALER."""

    def __init__(self, port: int) -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(f"tcp://127.0.0.1:{port}")

    def send(self, frames: list[bytes]) -> None:
        self._socket.send_multipart(frames)

    def recv(self, timeout: float) -> list[bytes] | None:
        if not self._socket.poll(int(timeout * 1000)):
            return None
        return self._socket.recv_multipart()

    def close(self) -> None:
        self._context.destroy(linger=0)


class RawTcp:
    """A bare socket speaking the ``"tcp"`` wire: a greeting, then length-prefixed frames."""

    def __init__(self, port: int) -> None:
        self._socket = socket.create_connection(("127.0.0.1", port))
        self._socket.sendall(GREETING)
        self._greeted = False

    def send(self, frames: list[bytes]) -> None:
        self._socket.sendall(wire(frames))

    def recv(self, timeout: float) -> list[bytes] | None:
        self._socket.settimeout(timeout)
        try:
            if not self._greeted:
                assert self._exactly(len(GREETING)) == GREETING
                self._greeted = True
            (count,) = struct.unpack("<I", self._exactly(4))
            lengths = struct.unpack(f"<{count}Q", self._exactly(8 * count))
            return [self._exactly(length) for length in lengths]
        except (TimeoutError, ConnectionError):
            return None

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            part = self._socket.recv(n - len(data))
            if not part:
                raise ConnectionError("closed by the server")
            data += part
        return data

    def close(self) -> None:
        self._socket.close()


def wire(frames: list[bytes]) -> bytes:
    """One message of the ``"tcp"`` wire."""
    lengths = struct.pack(f"<{len(frames)}Q", *(len(f) for f in frames))
    return struct.pack("<I", len(frames)) + lengths + b"".join(frames)


def raw_client(served: Served) -> RawZmq | RawTcp:
    return RawZmq(served.port) if served.transport == "zmq" else RawTcp(served.port)


def ask(client: RawZmq | RawTcp, frames: list[bytes], timeout: float = 10.0) -> list[Any]:
    """Send one request; its reply's ``[kind, req_id, body]``, then its other frames."""
    client.send(frames)
    reply = client.recv(timeout)
    assert reply is not None, f"no reply within {timeout} s"
    return [msgpack.unpackb(reply[0]), *reply[1:]]


def chunk_of(key: ChunkKey, identity: CacheIdentity = IDENTITY) -> list[bytes]:
    """A genuine chunk's header and payload."""
    payload = chunk_pattern(key, CHUNK)
    return [codec.encode_header(identity.digest, key, payload), payload]


# -- hostile clients ---------------------------------------------------------------------------
def test_a_connection_refused_at_a_later_handshake_is_served_nothing(served):
    """HELLO with this cache's identity, then HELLO with another's: the refusal must end the
    first admission, or a refused peer keeps reading the cache."""
    client = raw_client(served)
    try:
        assert ask(client, [proto.hello(1, IDENTITY.digest)])[0][2][0] is True
        assert ask(client, [proto.hello(2, OTHER.digest)])[0][2][0] is False
        kind, req_id, body = ask(client, [proto.keyed(proto.FETCH, 3, KEYS[:1])])[0]
        assert (kind, req_id, body) == (proto.REFUSED, 3, "hello first")
    finally:
        client.close()
    assert served.honest_load()


def test_refused_handshakes_are_each_counted_and_logged_sparingly(served, caplog):
    """A client repeating a HELLO of another identity: a warning per HELLO let any client
    write the server's log as fast as it sends."""
    client = raw_client(served)
    before = served.stats().get("refused_handshakes", 0)
    try:
        with caplog.at_level(logging.WARNING, logger="kvtier.tiers.peer.server"):
            for i in range(200):
                assert ask(client, [proto.hello(i, OTHER.digest)])[0][2][0] is False
    finally:
        client.close()
    assert served.stats()["refused_handshakes"] - before == 200
    assert len([r for r in caplog.records if "refused a peer" in r.getMessage()]) <= 2


def test_duplicate_keys_are_served_and_stored_once_each_without_leaking_holds(served):
    client = raw_client(served)
    new = make_keys(IDENTITY, 1, seed=77)[0]
    try:
        ask(client, [proto.hello(1, IDENTITY.digest)])
        stored = ask(client, [proto.keyed(proto.STORE, 2, [new, new]), *chunk_of(new) * 2])
        assert stored[0][2] == [True, True]
        fetched = ask(client, [proto.keyed(proto.FETCH, 3, [new] * 3 + [KEYS[0]] * 1021)])
        assert fetched[0][2] == [True] * 1024 and len(fetched) == 1 + 2 * 1024
        assert all(bytes(p) == chunk_pattern(new, CHUNK) for p in fetched[2:8:2])
        assert bytes(fetched[-1]) == chunk_pattern(KEYS[0], CHUNK)
    finally:
        client.close()
    wait_for(lambda: served.stats()["peer_held_slots"] == 0, timeout=30, what="holds released")
    assert served.stats().get("server_errors", 0) == 0


def test_a_stored_chunk_whose_header_names_another_key_is_refused(served):
    client = raw_client(served)
    victim = make_keys(IDENTITY, 1, seed=78)[0]
    try:
        ask(client, [proto.hello(1, IDENTITY.digest)])
        reply = ask(client, [proto.keyed(proto.STORE, 2, [victim]), *chunk_of(KEYS[1])])
        assert reply[0][2] == [False]
        assert ask(client, [proto.keyed(proto.LOOKUP, 3, [victim])])[0][2] == [proto.MISSING]
    finally:
        client.close()
    assert served.stats().get("store_integrity.key", 0) >= 1


def test_clients_that_vanish_mid_reply_leave_no_holds_and_the_server_serving(served):
    """A reconnect storm: each client shakes hands, asks for 800 chunks and leaves at once."""
    clients = []
    for _ in range(40):
        client = raw_client(served)
        client.send([proto.hello(1, IDENTITY.digest)])
        client.send([proto.keyed(proto.FETCH, 2, KEYS * 100)])
        clients.append(client)
    for client in clients:
        client.close()
    wait_for(lambda: served.stats()["peer_held_slots"] == 0, timeout=30, what="holds released")
    assert served.stats().get("server_errors", 0) == 0
    assert served.honest_load()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_store_to_a_server_that_refuses_stores_is_dropped_and_counted(transport):
    node = Served(transport, accept_stores=False)
    client = RawZmq(node.port) if transport == "zmq" else RawTcp(node.port)
    try:
        ask(client, [proto.hello(1, IDENTITY.digest)])
        new = make_keys(IDENTITY, 1, seed=79)[0]
        client.send([proto.keyed(proto.STORE, 2, [new]), *chunk_of(new)])
        dropped = ("messages_dropped_oversized", "connections_dropped_too_many_frames")
        wait_for(lambda: any(node.stats().get(c, 0) for c in dropped), what="the drop counted")
        assert not node.manager.host.is_ready(new)
        assert node.honest_load()
    finally:
        client.close()
        node.manager.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_client_that_never_reads_cannot_grow_a_zeromq_server_without_bound():
    """As ``test_peer_tcp_hostile``'s test of the same name, over ZeroMQ: FETCHes of 1024
    stored keys (35 KB each, replies of 8 MiB), never read. The ROUTER queued up to 1000
    replies per client: 100 requests grew the server by about 800 MiB. Now 16 queue at most
    (about 130 MiB)."""
    node = PeerNode(0, "--store", "1024", "--slots", "1024").start()
    sock: socket.socket | None = None
    try:
        assert node._proc is not None
        pid = node._proc.pid
        sock = zmtp_connect(node.port)
        sock.sendall(zmtp_frame(proto.hello(1, IDENTITY.digest)))
        time.sleep(0.5)
        before = rss_mib(pid)
        request = zmtp_frame(proto.keyed(proto.FETCH, 2, make_keys(IDENTITY, 1024)))
        sock.settimeout(10)
        for _ in range(100):
            sock.sendall(request)
        time.sleep(3.0)  # the server answers them all
        grown = rss_mib(pid) - before
        assert grown < 256, f"one non-reading client grew the server by {grown} MiB"
    finally:
        if sock is not None:
            sock.close()
        node.kill()


def zmtp_frame(data: bytes) -> bytes:
    """A last (not "more") ZMTP 3.0 frame."""
    if len(data) < 256:
        return bytes([0, len(data)]) + data
    return b"\x02" + struct.pack(">Q", len(data)) + data


# -- hostile servers ---------------------------------------------------------------------------
Answer = Callable[[int, list[ChunkKey]], list[bytes] | None]  # FETCH (req_id, keys) -> reply


class ScriptedServer:
    """Shakes hands as a kvtier server over ``transport`` (its own listener), then answers each
    FETCH with ``answer`` (``None``: never) and each LOOKUP with HELD."""

    def __init__(self, transport: str, answer: Answer) -> None:
        self._transport = transport_for(transport)
        limits = MessageLimits(1 << 20, 64, 1 << 22)
        listen = self._transport.listen
        self._listener, self.port = on_a_free_port(lambda p: listen("127.0.0.1", p, limits))
        self._answer = answer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._transport.wait(0.02)
            while (message := self._listener.recv()) is not None:
                peer, frames, _ = message
                reply = self._reply(*msgpack.unpackb(frames[0]))
                if reply is not None:
                    self._listener.send(peer, reply)

    def _reply(self, kind: int, req_id: int, body: Any) -> list[bytes] | None:
        if kind == proto.HELLO:
            return [proto.encode(proto.HELLO, req_id, [True, False, ""])]
        if kind == proto.LOOKUP:
            return [proto.encode(proto.LOOKUP, req_id, [proto.HELD] * len(body))]
        return self._answer(req_id, [ChunkKey(k) for k in body])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._listener.close()
        self._transport.close()


def found(req_id: int, chunks: list[list[bytes]], flags: list[bool] | None = None) -> list[bytes]:
    meta = proto.encode(proto.FETCH, req_id, flags or [True] * len(chunks))
    return [meta, *(frame for chunk in chunks for frame in chunk)]


def flipped(chunk: list[bytes]) -> list[bytes]:
    return [chunk[0], bytes([chunk[1][0] ^ 1]) + chunk[1][1:]]


SCENARIOS: dict[str, tuple[Answer, tuple[str, ...]]] = {
    "wrong_req_id": (
        lambda r, keys: found(r + 1000, [chunk_of(k) for k in keys]),
        ("stale_replies",),
    ),
    "another_keys_chunk": (
        lambda r, keys: found(r, [chunk_of(KEYS[7]) for _ in keys]),
        ("integrity.key",),
    ),
    "another_identitys_chunk": (
        lambda r, keys: found(r, [chunk_of(k, OTHER) for k in keys]),
        ("integrity.identity",),
    ),
    "checksum_mismatch": (
        lambda r, keys: found(r, [flipped(chunk_of(k)) for k in keys]),
        ("integrity.checksum",),
    ),
    "more_chunks_than_asked": (
        lambda r, keys: found(r, [chunk_of(k) for k in [*keys, KEYS[7]]]),
        ("mismatched_replies",),
    ),
    "header_without_payload": (
        lambda r, keys: [proto.encode(proto.FETCH, r, [True] * len(keys)), chunk_of(keys[0])[0]],
        ("malformed_replies",),
    ),
    "a_lookup_reply": (
        lambda r, keys: [proto.encode(proto.LOOKUP, r, [proto.HELD] * len(keys))],
        ("mismatched_replies",),
    ),
    "refused": (lambda r, keys: [proto.encode(proto.REFUSED, r, "hello first")], ()),
    "never_answers": (lambda r, keys: None, ("peer_failures",)),
}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_hostile_servers_reply_is_a_counted_miss_and_other_peers_still_serve(transport, scenario):
    answer, counters = SCENARIOS[scenario]
    hostile, honest = ScriptedServer(transport, answer), Served(transport, accept_stores=False)
    region = HostRegion(4, CHUNK)
    region.numpy(0)[:] = 7
    p2p = P2PTierConfig(host="127.0.0.1", port=hostile.port, transport=transport, timeout_s=0.5)
    tier = PeerTier(p2p, region, IDENTITY)  # type: ignore[arg-type]
    try:
        tier.submit_load(TransferJob(1, tuple(KEYS[:2]), (0, 1)))
        result = collect(tier, [1], timeout=30)[1]
        assert not result.ok and not result.succeeded, result
        stats = tier.stats()
        assert all(stats.get(c, 0) >= 1 for c in counters), stats
        assert stats.get("io_errors", 0) == 0
        # Another peer, hinted, is asked and loaded from.
        tier.hint(KEYS[2:4], "127.0.0.1", honest.port)
        assert settle_lookup(tier, KEYS[2], timeout=30) is HIT
        tier.submit_load(TransferJob(2, tuple(KEYS[2:4]), (2, 3)))
        assert collect(tier, [2], timeout=30)[2].ok
        assert holds(region, 2, KEYS[2]) and holds(region, 3, KEYS[3])
    finally:
        tier.close()
        hostile.close()
        honest.manager.close()


# -- misuse of the tier's API ------------------------------------------------------------------
def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_hints_that_name_no_peer_are_dropped_and_counted(transport):
    region = HostRegion(2, CHUNK)
    p2p = P2PTierConfig(host="127.0.0.1", port=9, transport=transport, timeout_s=0.2)
    tier = PeerTier(p2p, region, IDENTITY)  # type: ignore[arg-type]
    try:
        bad: list[tuple[Any, Any]] = [
            ("", 5710),
            ("127.0.0.1", 0),
            ("127.0.0.1", 1 << 16),
            ("127.0.0.1", -1),
            ("127.0.0.1", "5710"),
            ("127.0.0.1", True),
            (None, 5710),
            (b"127.0.0.1", 5710),
        ]
        for host, port in bad:
            tier.hint(KEYS[:1], host, port)
        wait_for(
            lambda: tier.stats().get("hints_dropped_bad_address", 0) == len(bad),
            what="every bad hint counted",
        )
        assert tier.stats().get("io_errors", 0) == 0
    finally:
        tier.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_hints_of_addresses_the_transport_refuses_leak_nothing(transport):
    """ "x y" is a string, but no address: libzmq refused it (an exception in the I/O thread)
    and kept the socket it had made for it, one per hint, past the 64 peers a tier keeps (a
    ``"tcp"`` link keeps a socket while its name is looked up: 64 at most)."""
    region = HostRegion(2, CHUNK)
    p2p = P2PTierConfig(host="127.0.0.1", port=9, transport=transport, timeout_s=0.2)
    tier = PeerTier(p2p, region, IDENTITY)  # type: ignore[arg-type]
    try:
        time.sleep(0.2)
        before = _open_fds()
        for port in range(1000, 1200):
            tier.hint(KEYS[:1], "x y", port)
        wait_for(
            lambda: any(k in tier.stats() for k in ("hints_dropped_too_many_peers", "io_errors")),
            what="the hints taken",
        )
        assert tier.stats().get("io_errors", 0) == 0
        assert _open_fds() - before <= MAX_PEERS + 8
    finally:
        tier.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_job_submitted_after_close_still_reports_once(transport):
    region = HostRegion(2, CHUNK)
    p2p = P2PTierConfig(host="127.0.0.1", port=9, transport=transport, timeout_s=0.2)
    tier = PeerTier(p2p, region, IDENTITY)  # type: ignore[arg-type]
    tier.close()
    tier.submit_load(TransferJob(1, tuple(KEYS[:1]), (0,)))
    tier.submit_store(TransferJob(2, tuple(KEYS[1:2]), (1,)))
    results = collect(tier, [1, 2], timeout=10)
    assert not results[1].ok and not results[2].ok
    assert tier.get_finished_jobs() == []


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_close_with_jobs_in_flight_reports_each_once(transport):
    silent = ScriptedServer(transport, lambda r, keys: None)
    region = HostRegion(8, CHUNK)
    p2p = P2PTierConfig(host="127.0.0.1", port=silent.port, transport=transport, timeout_s=30)
    tier = PeerTier(p2p, region, IDENTITY)  # type: ignore[arg-type]
    try:
        for job in range(4):
            tier.submit_load(TransferJob(job, (KEYS[job],), (job,)))
        time.sleep(0.3)  # sent and waiting for the silent server
        tier.close()
        results = collect(tier, range(4), timeout=10)
        assert not any(r.ok for r in results.values())
    finally:
        silent.close()
