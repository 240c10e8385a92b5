"""The peer tier over plain TCP (``transport: "tcp"``): real processes and real sockets.

Loads between processes, payloads landing in the caller's buffers, send receipts, and a
listener under hostile clients that speak the wire directly: every bound is tested at its value
and one past it, and an honest client is still answered afterwards.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from kvtier import RETRY, CacheIdentity, ConfigError, KVLayout, TieringManager
from kvtier.config import P2PTierConfig, TieringConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import MISS, TransferJob
from kvtier.tiers.peer import protocol as proto
from kvtier.tiers.peer import tcp_listener, tcp_sockets
from kvtier.tiers.peer.config import ServeConfig
from kvtier.tiers.peer.tcp_transport import TcpListener, TcpTransport
from kvtier.tiers.peer.tcp_wire import GREETING
from kvtier.tiers.peer.tier import PeerTier
from kvtier.tiers.peer.transport import Landing, MessageLimits, Transport
from kvtier.tiers.peer.zmq_transport import ZmqTransport
from kvtier.tiers.shared import codec
from tests.conftest import (
    collect,
    holds,
    make_keys,
    on_a_free_port,
    settle_lookup,
    store,
    wait_for,
)
from tests.tiers.peer_node import PeerNode

LIMITS = MessageLimits(max_frame_bytes=1000, max_frames=4, max_message_bytes=2000)


@pytest.fixture
def node() -> Iterator[PeerNode]:
    """A process serving 8 chunks over TCP."""
    node = PeerNode(0, "--store", "8", "--transport", "tcp").start()
    yield node
    node.kill()


def test_chunks_load_byte_identical_over_tcp_between_processes(node, identity):
    keys = make_keys(identity, 8)
    region = HostRegion(8, identity.layout.chunk_bytes)
    tier = node.tier(region, identity, transport="tcp", timeout_s=20.0)
    try:
        tier.submit_load(TransferJob(1, tuple(keys), tuple(range(8))))
        result = collect(tier, [1])[1]
        assert result.ok and set(result.succeeded) == set(keys)
        assert all(holds(region, slot, key) for slot, key in enumerate(keys))
        assert tier.stats()["fetched_chunks"] == 8
    finally:
        tier.close()


@pytest.mark.parametrize(("server", "client"), [("tcp", "zmq"), ("zmq", "tcp")])
def test_a_client_of_the_other_transport_gets_misses_not_a_hang(identity, server, client):
    """Transports differ: no handshake, so every lookup is a miss within ``timeout_s``."""
    node = PeerNode(0, "--store", "2", "--transport", server).start()
    tier = node.tier(
        HostRegion(2, identity.layout.chunk_bytes), identity, transport=client, timeout_s=0.5
    )
    try:
        assert settle_lookup(tier, make_keys(identity, 1)[0]) is MISS
    finally:
        tier.close()
        node.kill()


# -- configuration ----------------------------------------------------------------------------
def test_tcp_refuses_curve_keys_on_both_sides(tmp_path):
    key = tmp_path / "k"
    key.write_text("x")
    with pytest.raises(ConfigError, match="transport"):
        P2PTierConfig(
            host="127.0.0.1",
            port=5,
            transport="tcp",
            curve_secret_key_file=str(key),
            curve_server_key_file=str(key),
        )
    with pytest.raises(ConfigError, match="transport"):
        ServeConfig(
            port=5, transport="tcp", curve_secret_key_file=str(key), curve_client_keys_dir="."
        )
    assert ServeConfig(port=5).transport == "zmq"


@pytest.mark.parametrize("value", ["udp", "TCP", "", 1, None])
def test_an_unknown_transport_is_a_config_error(value):
    with pytest.raises(ConfigError, match="transport"):
        TieringConfig.from_dict(
            {"cpu_bytes_to_use": 1 << 20, "serve": {"port": 5, "transport": value}}
        )


# -- the transport itself ---------------------------------------------------------------------
class Pair:
    """A listener and a client channel of two transports on this thread."""

    def __init__(
        self, limits: MessageLimits = LIMITS, transport: Callable[[], Transport] = TcpTransport
    ) -> None:
        self.server, self.client = transport(), transport()
        self.listener, port = on_a_free_port(lambda p: self.server.listen("127.0.0.1", p, limits))
        self.channel = self.client.connect("127.0.0.1", port, limits)

    def turn(self) -> None:
        self.client.wait(0.005)
        self.server.wait(0.005)

    def request(self, timeout: float = 5.0) -> tuple[bytes, list[memoryview], bytes | None]:
        deadline = time.monotonic() + timeout
        while (message := self.listener.recv()) is None:
            assert time.monotonic() < deadline, "no request arrived"
            self.turn()
        return message

    def reply(self, place=None, timeout: float = 5.0) -> list[memoryview]:
        deadline = time.monotonic() + timeout
        while (message := self.channel.recv(place)) is None:
            assert time.monotonic() < deadline, "no reply arrived"
            self.turn()
        return message

    def close(self) -> None:
        self.client.close()
        self.server.close()


@pytest.fixture
def pair() -> Iterator[Pair]:
    pair = Pair()
    yield pair
    pair.close()


def test_messages_keep_their_frames_both_ways(pair):
    assert pair.channel.send([b"meta", b"", b"x" * 1000])
    peer, frames, user = pair.request()
    assert [bytes(f) for f in frames] == [b"meta", b"", b"x" * 1000] and user is None
    pair.listener.send(peer, [b"ok"])
    assert [bytes(f) for f in pair.reply()] == [b"ok"]


def test_a_frame_lands_in_the_buffer_place_gives_and_one_too_long_comes_back_empty(pair):
    """Frame 1 fits its buffer exactly (received into it); frame 2 is one byte longer than its
    buffer: cut off, returned empty, and the frame after it still arrives whole."""
    peer = _connected(pair)
    fits, short = bytearray(300), bytearray(299)
    asked = []

    def place(index, frames):
        asked.append((index, [bytes(f) for f in frames]))
        return {1: memoryview(fits), 2: memoryview(short)}.get(index)

    pair.listener.send(peer, [b"m", b"a" * 300, b"b" * 300, b"tail"])
    frames = pair.reply(place)
    assert bytes(fits) == b"a" * 300 and frames[1].obj is fits
    assert len(frames[2]) == 0 and bytes(short) == bytes(299)
    assert bytes(frames[3]) == b"tail"
    assert asked[0] == (1, [b"m"]) and [i for i, _ in asked] == [1, 2, 3]


@pytest.mark.parametrize("transport", [TcpTransport, ZmqTransport])
def test_a_checksummed_landing_holds_every_byte_and_its_checksum(transport):
    """A payload landing with a checksum (``feed`` over TCP, ``copy_in`` over ZeroMQ): its bytes
    in the buffer and the checksum of exactly those; one byte too long: empty, buffer untouched,
    nothing folded, and the frame after it whole."""
    pair = Pair(LIMITS, transport)
    try:
        peer, payload = _connected(pair), os.urandom(900)
        buffers, fillings = {1: bytearray(900), 2: bytearray(899)}, {}

        def place(index, frames):
            if index not in buffers:
                return None
            filling = fillings[index] = codec.filling(memoryview(buffers[index]))
            return Landing(memoryview(buffers[index]), filling.feed, filling.copy_in)

        pair.listener.send(peer, [b"m", payload, payload, b"tail"])
        frames = pair.reply(place)
        assert bytes(frames[1]) == payload and frames[1].obj is buffers[1]
        assert fillings[1].digest(900) == codec.checksum(payload)
        assert len(frames[2]) == 0 and bytes(buffers[2]) == bytes(899)
        assert fillings[2].digest(899) == codec.checksum(bytes(899))
        assert bytes(frames[3]) == b"tail"
    finally:
        pair.close()


@pytest.mark.parametrize("transport", [TcpTransport, ZmqTransport])
def test_a_payload_that_fills_its_slot_exactly_lands_with_its_checksum(transport):
    """A 1 MiB payload into a 1 MiB buffer: the checksum folded as it landed (over ZeroMQ, by
    ``copy_in`` without the GIL) is the payload's."""
    size = (1 << 20) + 7
    pair = Pair(MessageLimits(size, 4, 2 * size), transport)
    try:
        peer, payload, slot = _connected(pair), os.urandom(size), bytearray(size)
        filling = codec.filling(memoryview(slot))
        land = Landing(memoryview(slot), filling.feed, filling.copy_in)
        pair.listener.send(peer, [b"m", payload])
        frames = pair.reply(lambda index, frames: land if index == 1 else None)
        assert frames[1].obj is slot and bytes(slot) == payload
        assert filling.digest(size) == codec.checksum(payload)
    finally:
        pair.close()


def test_a_receipt_is_done_only_once_the_kernel_has_every_byte(pair):
    peer = _connected(pair)
    payload = bytearray(64 << 20)
    big = Pair(MessageLimits(64 << 20, 2, 65 << 20))
    try:
        peer = _connected(big)
        receipt = big.listener.send(peer, [b"m", payload])
        for _ in range(20):
            big.server.wait(0.005)  # nobody reads on the client side
        assert not receipt.done, "64 MiB cannot all be in the kernel's buffers"
        frames = big.reply(timeout=30)
        assert len(frames[1]) == 64 << 20
        wait_for(lambda: (big.server.wait(0.005), receipt.done)[1], what="receipt done")
    finally:
        big.close()


def test_a_closed_client_channel_refuses_sends(pair):
    pair.channel.close()
    assert pair.channel.send([b"x"]) is False
    assert pair.channel.recv() is None


def test_an_address_that_does_not_resolve_gives_a_closed_channel():
    """Once the resolver's answer (or its deadline) is in, a send fails."""
    transport = TcpTransport()
    try:
        channel = transport.connect("no-such-host.invalid", 1, LIMITS)
        deadline = time.monotonic() + tcp_sockets.RESOLVE_TIMEOUT_S + 5
        while channel.send([b"x"]):
            assert time.monotonic() < deadline, "the channel stayed open"
            transport.wait(0.05)
    finally:
        transport.close()


def test_listening_on_a_taken_port_is_a_config_error(pair):
    other = TcpTransport()
    try:
        with pytest.raises(ConfigError, match="cannot listen"):
            other.listen("127.0.0.1", pair.listener.port, LIMITS)
    finally:
        other.close()


# -- hostile clients --------------------------------------------------------------------------
def test_an_idle_connection_is_polled_for_nothing_but_its_next_message(pair):
    """Once its bytes are written, neither side polls a connection for writability: a socket
    is nearly always writable, so ``wait`` would return at once, a busy loop."""
    peer = _connected(pair)
    pair.listener.send(peer, [b"ok"])
    assert [bytes(f) for f in pair.reply()] == [b"ok"]
    pair.turn()
    assert pair.client._poller.poll(0) == [] and pair.server._poller.poll(0) == []


def _connected(pair: Pair) -> bytes:
    """The listener's id for ``pair``'s channel (after one message)."""
    pair.channel.send([b"hi"])
    return pair.request()[0]


def raw_client(listener: TcpListener, greeting: bytes = GREETING) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", listener.port))
    sock.sendall(greeting)
    return sock


def message(frames: list[bytes], lengths: list[int] | None = None) -> bytes:
    lengths = [len(f) for f in frames] if lengths is None else lengths
    prefix = struct.pack("<I", len(lengths)) + struct.pack(f"<{len(lengths)}Q", *lengths)
    return prefix + b"".join(frames)


def served(pair: Pair, sock: socket.socket, data: bytes) -> bool:
    """Send ``data`` from ``sock``: whether the listener delivered a message, or (``False``)
    dropped the connection; an honest client is answered either way."""
    sock.sendall(data)
    delivered = False
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pair.turn()
        got = pair.listener.recv()
        if got is not None:
            delivered = True
            break
        if sum(pair.listener.stats().values()):
            break
    pair.channel.send([b"honest"])
    assert bytes(pair.request()[1][0]) == b"honest"
    return delivered


@pytest.mark.parametrize(
    ("frames", "lengths", "reason"),
    [
        ([b"x"] * 4, None, None),
        ([b"x"] * 5, None, "too_many_frames"),
        ([], [], "empty_message"),
        ([b"y" * 1000], None, None),
        ([b"y" * 1001], None, "oversized_frame"),
        ([b"z" * 1000, b"z" * 1000], None, None),
        ([b"z" * 1000, b"z" * 1000, b"z"], None, "oversized_message"),
        ([], [2**64 - 1], "oversized_frame"),
        ([], [1000, 1000, 1000, 2**63], "oversized_frame"),
    ],
)
def test_every_bound_holds_at_its_value_and_one_past_it(pair, frames, lengths, reason):
    _connected(pair)
    sock = raw_client(pair.listener)
    try:
        delivered = served(pair, sock, message(frames, lengths))
    finally:
        sock.close()
    stats = pair.listener.stats()
    if reason is None:
        assert delivered and not stats
    else:
        assert not delivered and stats == {f"connections_dropped_{reason}": 1}


def test_a_client_with_another_greeting_is_dropped(pair):
    _connected(pair)
    sock = raw_client(pair.listener, b"\xff\xfeZMTP!!")  # 8 bytes, not ours
    try:
        assert not served(pair, sock, b"")
    finally:
        sock.close()
    assert pair.listener.stats() == {"connections_dropped_bad_greeting": 1}


def test_unfinished_messages_and_silent_connections_are_dropped(pair, monkeypatch):
    monkeypatch.setattr(tcp_listener, "UNFINISHED_S", 0.3)
    _connected(pair)
    silent = socket.create_connection(("127.0.0.1", pair.listener.port))  # never greets
    partial = raw_client(pair.listener)
    partial.sendall(message([b"a" * 100])[:-1])  # one byte short, forever
    idle = raw_client(pair.listener)
    idle.sendall(message([b"done"]))  # whole, then idle: kept
    try:
        pair.request()
        wait_for(
            lambda: (
                (pair.turn(), pair.listener.recv(), pair.listener.stats())[2].get(
                    "connections_dropped_stalled"
                )
                == 2
            ),
            what="two stalled connections dropped",
        )
        idle.sendall(message([b"again"]))
        assert bytes(pair.request()[1][0]) == b"again"
    finally:
        for sock in (silent, partial, idle):
            sock.close()


def test_connections_past_the_limit_are_closed_at_once(pair, monkeypatch):
    monkeypatch.setattr(tcp_listener, "MAX_CONNECTIONS", 3)
    _connected(pair)  # one
    socks = [raw_client(pair.listener) for _ in range(3)]
    try:
        wait_for(
            lambda: (
                (pair.turn(), pair.listener.stats())[1].get("connections_dropped_over_limit") == 1
            ),
            what="the fourth connection dropped",
        )
        pair.channel.send([b"still here"])
        assert bytes(pair.request()[1][0]) == b"still here"
    finally:
        for sock in socks:
            sock.close()


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether ``sock``'s peer closed it (EOF or reset) within 5 s, past what it had sent."""
    sock.settimeout(5)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def test_at_the_limit_a_new_connection_displaces_the_one_quiet_longest(pair, monkeypatch):
    """Clients that connect and then say nothing held every place for ever, and every later
    client was closed at once. Now a newcomer takes the place of the quietest connection, once
    that has been quiet for ``DISPLACE_QUIET_S``; a connection heard from since keeps its own."""
    monkeypatch.setattr(tcp_listener, "MAX_CONNECTIONS", 3)
    monkeypatch.setattr(tcp_listener, "DISPLACE_QUIET_S", 0.3)
    _connected(pair)
    quiet = [raw_client(pair.listener) for _ in range(2)]
    newcomer = None
    try:
        wait_for(lambda: (pair.turn(), len(pair.listener._conns))[1] == 3, what="three accepted")
        time.sleep(0.4)
        _connected(pair)  # heard from again: not the quietest
        newcomer = raw_client(pair.listener)
        newcomer.sendall(message([b"newcomer"]))
        got = pair.request()
        assert bytes(got[1][0]) == b"newcomer"
        assert pair.listener.stats() == {"connections_displaced_quiet": 1}
        assert closed_by_peer(quiet[0]), "the quietest connection was not closed"
        pair.channel.send([b"still here"])
        assert bytes(pair.request()[1][0]) == b"still here"
    finally:
        for sock in [*quiet, *([newcomer] if newcomer else [])]:
            sock.close()


def test_both_ends_probe_a_quiet_connection_so_a_vanished_peer_does_not_hold_it(pair):
    """A host gone without closing (powered off, unplugged) left a half-open connection that
    counted against MAX_CONNECTIONS, and a client waiting on it, for ever: nothing is sent on
    an idle connection, so nothing fails. With keepalive the kernel probes after 60 s quiet,
    every 10 s, and fails the connection at the third probe unanswered."""
    _connected(pair)
    (accepted,) = pair.listener._conns.values()
    for sock in (accepted.sock, pair.channel._conn.sock):
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 60
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 10
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3


def test_zeromq_connections_are_probed_alike():
    zmq = pytest.importorskip("zmq")
    from kvtier.tiers.peer.zmq_transport import ZmqTransport

    transport = ZmqTransport()
    try:
        listener = transport.listen("127.0.0.1", 0, LIMITS)
        transport.connect("127.0.0.1", listener.port, LIMITS)
        options = {zmq.TCP_KEEPALIVE: 1, zmq.TCP_KEEPALIVE_IDLE: 60}
        options |= {zmq.TCP_KEEPALIVE_INTVL: 10, zmq.TCP_KEEPALIVE_CNT: 3}
        for sock in transport._sockets:  # the listener's and the client's
            assert {option: sock.getsockopt(option) for option in options} == options
    finally:
        transport.close()


def test_a_client_flooding_messages_does_not_starve_another(pair):
    _connected(pair)
    flood = raw_client(pair.listener)
    try:
        flood.sendall(message([b"spam"]) * 2000)
        pair.channel.send([b"honest"])
        seen = [bytes(pair.request()[1][0]) for _ in range(40)]
        assert b"honest" in seen
    finally:
        flood.close()


# -- a hostile server -------------------------------------------------------------------------
class RawServer:
    """A listening socket that greets each client with ``greeting`` and then sends ``data``."""

    def __init__(self, greeting: bytes, data: bytes) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.greeting, self.data = greeting, data
        self.clients: list[socket.socket] = []

    def serve(self) -> None:
        self.sock.settimeout(5)
        client, _ = self.sock.accept()
        client.sendall(self.greeting + self.data)
        self.clients.append(client)

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.sock.close()


@pytest.mark.parametrize(
    ("greeting", "data"),
    [
        (b"NOTKVTIER", b""),
        (GREETING, message([], [2**64 - 1])),
        (GREETING, message([], [1] * 10_000)),
    ],
    ids=["greeting", "huge_frame", "many_frames"],
)
def test_a_hostile_server_closes_the_channel(greeting, data):
    server, client = RawServer(greeting, data), TcpTransport()
    try:
        channel = client.connect("127.0.0.1", server.port, LIMITS)
        server.serve()
        deadline = time.monotonic() + 5
        while channel.send([b"x"]):
            assert time.monotonic() < deadline, "the channel stayed open"
            client.wait(0.01)
            assert channel.recv() is None
    finally:
        client.close()
        server.close()


def test_a_hostile_server_costs_the_tier_a_miss(identity):
    """A server that greets and then claims a huge reply: the load fails, nothing hangs."""
    server = RawServer(GREETING, message([], [2**40]))
    region = HostRegion(2, identity.layout.chunk_bytes)
    p2p = P2PTierConfig(host="127.0.0.1", port=server.port, transport="tcp", timeout_s=0.5)
    tier = PeerTier(p2p, region, identity)
    try:
        server.serve()
        tier.submit_load(TransferJob(1, tuple(make_keys(identity, 1)), (0,)))
        assert not collect(tier, [1])[1].ok
    finally:
        tier.close()
        server.close()


def test_reply_limits_admit_a_full_fetch_and_no_more():
    chunk = 1 << 20
    limits = proto.reply_limits(chunk)
    keys = proto.fetch_batch(chunk)
    assert limits.max_frames == 1 + 2 * keys
    assert limits.max_message_bytes >= proto.MAX_META_BYTES + keys * (4096 + chunk)
    assert limits.max_frame_bytes == max(chunk, proto.MAX_META_BYTES)


def test_a_manager_loads_from_a_serving_manager_over_tcp(identity):
    """Both ends configured as operators do: ``serve.transport`` and the p2p tier's."""
    keys = make_keys(identity, 4)
    node = PeerNode(0, "--store", "4", "--transport", "tcp").start()
    tier_entry = {"type": "p2p", "host": "127.0.0.1", "port": node.port, "transport": "tcp"}
    config = TieringConfig.from_dict(
        {"cpu_bytes_to_use": 16 << 20, "secondary_tiers": [tier_entry]}
    )
    try:
        with TieringManager(config, identity) as manager:
            deadline = time.monotonic() + 20
            while (found := manager.lookup(keys)) is RETRY:
                assert time.monotonic() < deadline, "lookup kept answering RETRY"
                time.sleep(0.005)
            assert found == len(keys)
            slots = manager.prepare_load(keys)
            assert all(holds(manager.region, s, k) for s, k in zip(slots, keys, strict=True))
            manager.complete_load(keys)
    finally:
        node.kill()


@pytest.mark.parametrize("host", ["*", "::1"])
def test_a_listener_binds_every_interface_or_ipv6(host):
    server, client = TcpTransport(), TcpTransport()
    try:
        listener = server.listen(host, 0, LIMITS)
        channel = client.connect("::1" if host == "::1" else "127.0.0.1", listener.port, LIMITS)
        channel.send([b"x"])
        deadline = time.monotonic() + 5
        while listener.recv() is None:
            assert time.monotonic() < deadline
            client.wait(0.005)
            server.wait(0.005)
    finally:
        client.close()
        server.close()


def test_a_host_name_is_resolved_and_a_hanging_resolver_never_stalls_the_transport(monkeypatch):
    """A name is looked up on a thread of its own: ``connect`` returns at once, bytes sent
    meanwhile wait, and a lookup that never answers closes the channel after
    ``RESOLVE_TIMEOUT_S``. Before, each connect held the transport's thread for that long."""
    server, client = TcpTransport(), TcpTransport()
    try:
        listener = server.listen("127.0.0.1", 0, LIMITS)
        channel = client.connect("localhost", listener.port, LIMITS)
        assert channel.send([b"by name"])
        deadline = time.monotonic() + 5
        while (got := listener.recv()) is None:
            assert time.monotonic() < deadline
            client.wait(0.005)
            server.wait(0.005)
        assert bytes(got[1][0]) == b"by name"

        real, answer = socket.getaddrinfo, threading.Event()

        def hanging(host, *args, **kwargs):
            numeric = len(args) >= 5 and args[4] & socket.AI_NUMERICHOST
            if host == "slow.example" and not numeric:  # a resolver that does not answer
                answer.wait(30)
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", hanging)
        monkeypatch.setattr(tcp_sockets, "RESOLVE_TIMEOUT_S", 0.3)
        started = time.monotonic()
        channel = client.connect("slow.example", listener.port, LIMITS)
        assert channel.send([b"x"]), "a send while the name resolves waits"
        client.wait(0.05)
        assert time.monotonic() - started < 0.3, "the resolver held the transport's thread"
        deadline = time.monotonic() + 5
        while channel.send([b"x"]):
            assert time.monotonic() < deadline, "a lookup that never answers left it open"
            client.wait(0.05)
        answer.set()
    finally:
        client.close()
        server.close()


def test_names_resolving_at_once_are_bounded(monkeypatch):
    """Threads stuck in a resolver that never answers are not started without end: past
    ``MAX_RESOLVING`` names a connect to another name gives a closed channel at once; once an
    answer comes (here: the resolver fails, which is not kept) the name is looked up again."""
    monkeypatch.setattr(tcp_sockets, "MAX_RESOLVING", 1)
    answer, real = threading.Event(), socket.getaddrinfo

    def hanging(host, *args, **kwargs):
        if host.endswith("slow.example") and not (
            len(args) >= 5 and args[4] & socket.AI_NUMERICHOST
        ):
            answer.wait(30)
            raise socket.gaierror("no such name")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    client = TcpTransport()
    try:
        first = client.connect("slow.example", 1, LIMITS)
        assert first.send([b"x"])
        assert not client.connect("other.slow.example", 1, LIMITS).send([b"x"])
        answer.set()
        deadline = time.monotonic() + 5
        while first.send([b"x"]):  # the failed answer closes it
            assert time.monotonic() < deadline
            client.wait(0.05)
        assert client.connect("other.slow.example", 1, LIMITS).send([b"x"])
    finally:
        client.close()


def next_message(client: TcpTransport, server: TcpTransport, listener) -> tuple:
    deadline = time.monotonic() + 5
    while (got := listener.recv()) is None:
        assert time.monotonic() < deadline, "no message arrived"
        client.wait(0.01)
        server.wait(0.01)
    return got


def test_a_kept_answer_is_asked_again_once_its_time_is_up(monkeypatch):
    """Past ``RESOLVED_TTL_S`` (here 0) a name is looked up again: the resolver's word may
    have changed."""
    monkeypatch.setattr(tcp_sockets, "RESOLVED_TTL_S", 0.0)
    server, client = TcpTransport(), TcpTransport()
    real, asked = socket.getaddrinfo, []

    def counted(host, *args, **kwargs):
        if host == "named.test" and not (len(args) >= 5 and args[4] & socket.AI_NUMERICHOST):
            asked.append(host)
            return real("127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", counted)
    try:
        listener = server.listen("127.0.0.1", 0, LIMITS)
        for word in (b"first", b"second"):
            assert client.connect("named.test", listener.port, LIMITS).send([word])
            assert bytes(next_message(client, server, listener)[1][0]) == word
        assert asked == ["named.test", "named.test"]
    finally:
        client.close()
        server.close()


def test_a_name_is_looked_up_once_and_its_answer_outlives_the_channel_that_asked(monkeypatch):
    """A link gives up on a slow lookup (its handshake deadline, 1 s by default, may come
    first) and tries again later: the answer that came meanwhile is used, without asking the
    resolver again. Two channels asking at once share one lookup."""
    server, client = TcpTransport(), TcpTransport()
    real, asked = socket.getaddrinfo, []

    def slow(host, *args, **kwargs):
        if host == "slow.test" and not (len(args) >= 5 and args[4] & socket.AI_NUMERICHOST):
            asked.append(host)
            time.sleep(0.3)
            return real("127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    try:
        listener = server.listen("127.0.0.1", 0, LIMITS)
        client.connect("slow.test", listener.port, LIMITS).close()  # given up at once
        waiting = client.connect("slow.test", listener.port, LIMITS)
        assert waiting.send([b"waiting"])
        assert bytes(next_message(client, server, listener)[1][0]) == b"waiting"
        later = client.connect("slow.test", listener.port, LIMITS)
        assert later.send([b"later"])
        assert bytes(next_message(client, server, listener)[1][0]) == b"later"
        assert asked == ["slow.test"]
    finally:
        client.close()
        server.close()


def test_payloads_are_verified_with_the_checksum_taken_as_they_landed(monkeypatch):
    """1 MiB chunks: a reply arrives over many reads; each payload is hashed as it lands, and
    the tier's I/O thread never hashes it a second time to verify it."""
    from kvtier.tiers.shared import codec

    layout = KVLayout(4, 8, 128, "float16", block_size=16, blocks_per_chunk=4)
    identity = CacheIdentity(model="test/big", layout=layout)
    second_passes = []
    real = codec.checksum

    def counted(data):
        if threading.current_thread().name.endswith("-io"):  # the client's I/O thread
            second_passes.append(len(data))
        return real(data)

    monkeypatch.setattr(codec, "checksum", counted)
    keys = make_keys(identity, 4)

    def serving(port: int) -> TieringManager:
        serve = {"port": port, "transport": "tcp"}
        config = {"cpu_bytes_to_use": 8 * layout.chunk_bytes, "serve": serve}
        return TieringManager(TieringConfig.from_dict(config), identity)

    with on_a_free_port(serving)[0] as server:
        store(server, keys)
        assert server.peer_server is not None
        region = HostRegion(4, layout.chunk_bytes)
        p2p = P2PTierConfig(
            host="127.0.0.1", port=server.peer_server.port, transport="tcp", timeout_s=20.0
        )
        tier = PeerTier(p2p, region, identity)
        try:
            tier.submit_load(TransferJob(1, tuple(keys), tuple(range(4))))
            assert collect(tier, [1])[1].succeeded == frozenset(keys)
        finally:
            tier.close()
    assert all(holds(region, slot, key) for slot, key in enumerate(keys))
    assert second_passes == [], f"{len(second_passes)} payloads hashed a second time"


@pytest.mark.parametrize("transport", ["zmq", "tcp"])
def test_a_job_submitted_after_close_writes_nowhere(identity, transport, tmp_path):
    """``close`` then ``submit_load``: the wake-up of a closed transport writes to no file,
    even one that took the number of its pipe."""
    region = HostRegion(2, identity.layout.chunk_bytes)
    p2p = P2PTierConfig(host="127.0.0.1", port=9, transport=transport, timeout_s=0.2)
    tier = PeerTier(p2p, region, identity)
    tier.close()
    with contextlib.ExitStack() as files:  # these may take the numbers of the pipe's fds
        for i in range(8):
            files.enter_context(open(tmp_path / f"f{i}", "wb"))
        tier.submit_load(TransferJob(1, tuple(make_keys(identity, 1)), (0,)))
    assert all((tmp_path / f"f{i}").read_bytes() == b"" for i in range(8))


def test_a_listener_out_of_descriptors_rests_instead_of_spinning_then_accepts(pair):
    """With no descriptor left (EMFILE) a waiting connection cannot be accepted; the listener
    is not polled again for a while (``accept_failures`` stays small, where a spinning
    ``poll`` would count hundreds), and it takes the connection once descriptors are free."""
    import resource

    _connected(pair)
    waiting = raw_client(pair.listener)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
        with contextlib.suppress(OSError):
            while True:
                fillers.append(os.open("/dev/null", os.O_RDONLY))
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            pair.server.wait(0.05)
        failures = pair.listener.stats().get("accept_failures", 0)
        assert 1 <= failures <= 3, f"{failures} failed accepts in 0.3 s"
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    waiting.sendall(message([b"let in"]))
    try:
        assert bytes(pair.request(timeout=10)[1][0]) == b"let in"
    finally:
        waiting.close()


def test_a_client_that_does_not_read_gets_a_bounded_queue_then_is_dropped(monkeypatch):
    """Replies to a client that reads nothing: the ninth and later are dropped while eight
    wait, and once none has moved for ``UNFINISHED_S`` the connection is dropped."""
    monkeypatch.setattr(tcp_listener, "UNFINISHED_S", 0.3)
    limits = MessageLimits(1 << 20, 2, 2 << 20)
    server = TcpTransport()
    listener = server.listen("127.0.0.1", 0, limits)
    sock = socket.create_connection(("127.0.0.1", listener.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.sendall(GREETING + message([b"request"]))
        peer = next_request(server, listener)
        big = bytes(8 << 20)  # more than the kernel's buffers take
        receipts = [listener.send(peer, [b"reply", big]) for _ in range(9)]
        assert not any(r.done for r in receipts[:8]) and receipts[8].done
        assert listener.stats() == {"replies_dropped_backlog": 1}
        wait_for(
            lambda: (
                (server.wait(0.01), listener.recv(), listener.stats())[2].get(
                    "connections_dropped_slow_reader"
                )
                == 1
            ),
            what="the connection dropped",
        )
        assert all(r.done for r in receipts), "a dropped connection's buffers are released"
    finally:
        sock.close()
        server.close()


def next_request(server: TcpTransport, listener: TcpListener) -> bytes:
    deadline = time.monotonic() + 5
    while (got := listener.recv()) is None:
        assert time.monotonic() < deadline, "no request arrived"
        server.wait(0.005)
    return got[0]
