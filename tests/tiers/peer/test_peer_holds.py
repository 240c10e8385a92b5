"""A client that repeats FETCH without reading its replies cannot take the engine's host slots.

The serving manager runs in this process (its own driver thread answers peers) with 32 host
slots of 256 KiB, all holding chunks. The hostile client is a raw DEALER on a thread of its own
that shakes hands and then asks for every chunk again and again, never reading a reply: its
replies stall in TCP, and past the few the server queues for it they are dropped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from kvtier import CacheIdentity, KVLayout, TieringManager
from kvtier.cli.main import main
from kvtier.config import P2PTierConfig
from kvtier.core.host_slots import HostTier
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.peer import protocol as proto
from kvtier.tiers.peer.curve_keys import read_key
from kvtier.tiers.peer.server_holds import PeerHolds, owner_of
from kvtier.tiers.peer.tier import PeerTier
from tests.conftest import collect, config, fill, holds, make_keys, wait_for
from tests.tiers.s3_server import free_port

LAYOUT = KVLayout(
    num_layers=4, num_kv_heads=8, head_dim=128, dtype="float16", block_size=16, blocks_per_chunk=1
)
IDENTITY = CacheIdentity(model="test/model", revision="r1", layout=LAYOUT)
SLOTS, HOLD_TIMEOUT_S = 32, 1.0
KEYS = make_keys(IDENTITY, SLOTS)


def store(manager: TieringManager, keys: list[ChunkKey]) -> bool:
    """The engine's store of ``keys``; False when ``prepare_store`` found no slots."""
    plan = manager.prepare_store(keys)
    if plan is None:
        return False
    for key, slot in zip(plan.keys, plan.slots):
        fill(manager.region, slot, key)
    manager.complete_store(plan.keys)
    return True


def held_slots(manager: TieringManager) -> int:
    return int(manager.stats()["host"]["held_slots"])


class Hoarder:
    """Repeats FETCH of every key until stopped; reads nothing after its handshake.

    ``curve``: (its secret key file, the server's public key file) to connect with CURVE.
    """

    def __init__(self, port: int, curve: tuple[Path, Path] | None = None) -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        for option, value in ((zmq.LINGER, 0), (zmq.RCVHWM, 1), (zmq.RCVBUF, 4096)):
            self._socket.setsockopt(option, value)
        if curve is not None:
            secret = read_key(curve[0], "secret")
            self._socket.curve_secretkey = secret
            self._socket.curve_publickey = zmq.curve_public(secret)
            self._socket.curve_serverkey = read_key(curve[1], "server")
        self._socket.connect(f"tcp://127.0.0.1:{port}")
        self._socket.send(proto.hello(1, IDENTITY.digest))
        assert self._socket.poll(20_000), "no handshake reply"
        self._socket.recv()
        self.sent, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.sent += 1
            self._socket.send(proto.keyed(proto.FETCH, 100 + self.sent, KEYS))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._context.destroy(linger=0)


@pytest.fixture
def server() -> Iterator[TieringManager]:
    serve = {"port": free_port(), "hold_timeout_s": HOLD_TIMEOUT_S}
    manager = TieringManager(config(SLOTS, LAYOUT, serve=serve), IDENTITY)
    assert store(manager, KEYS)
    yield manager
    manager.close()


def honest_fetch(port: int) -> None:
    """Another client is served meanwhile: each client has a budget of its own."""
    region = HostRegion(2, LAYOUT.chunk_bytes)
    tier = PeerTier(P2PTierConfig(host="127.0.0.1", port=port, timeout_s=10.0), region, IDENTITY)
    try:
        tier.submit_load(TransferJob(1, tuple(KEYS[:2]), (0, 1)))
        assert collect(tier, [1], timeout=30)[1].ok, "an honest client was refused"
        assert holds(region, 0, KEYS[0]) and holds(region, 1, KEYS[1])
    finally:
        tier.close()


def test_a_hoarding_client_leaves_the_engine_slots_and_its_holds_expire(server):
    assert server.peer_server is not None
    hoarder = Hoarder(server.peer_server.port)
    try:
        wait_for(
            lambda: held_slots(server) > 0 and hoarder.sent > 20,
            timeout=20,
            what="the hoarder being served",
        )
        honest_fetch(server.peer_server.port)
        for round_ in range(5):  # while it keeps asking, the engine still gets slots
            new = make_keys(IDENTITY, 4, seed=100 + round_)
            assert store(server, new), f"prepare_store found no slots (round {round_})"
            time.sleep(0.1)
        # Its holds end: at their deadline while its replies stall unread (it then gets no
        # more), or at once when a reply past those queued for it is dropped. It never holds
        # more than its budget, a quarter of the slots; the engine keeps the rest.
        wait_for(
            lambda: held_slots(server) == 0,
            timeout=HOLD_TIMEOUT_S + 20,
            what="the hoarder's holds ending",
        )
        asked = hoarder.sent
        wait_for(lambda: hoarder.sent > asked + 50, timeout=20, what="the hoarder asking more")
        assert held_slots(server) <= SLOTS // 4, "the hoarder held past its budget"
        engine = make_keys(IDENTITY, SLOTS - SLOTS // 4, seed=7)
        assert store(server, engine), "the slots past the budget are the engine's"
    finally:
        hoarder.stop()
    stats = server.peer_server.stats()
    # Its held replies were dropped past its queue of unread replies (their holds released at
    # once), or stalled in that queue until their deadline (then it was refused).
    stalled = stats.get("holds_expired", 0) >= 1 and stats.get("fetch_refused_stalled", 0) >= 1
    assert stalled or stats.get("replies_dropped_backlog", 0) >= 1, stats


def test_fetches_past_a_clients_budget_are_served_unpinned(server):
    """Budget 8 (a quarter of 32 slots): four loads of 8 chunks in flight at once all succeed."""
    assert server.peer_server is not None
    region = HostRegion(SLOTS, LAYOUT.chunk_bytes)
    p2p = P2PTierConfig(host="127.0.0.1", port=server.peer_server.port, timeout_s=10.0)
    tier = PeerTier(p2p, region, IDENTITY)
    try:
        for job in range(4):
            part = range(8 * job, 8 * job + 8)
            tier.submit_load(TransferJob(job, tuple(KEYS[i] for i in part), tuple(part)))
        results = collect(tier, range(4), timeout=60)
        assert all(result.ok for result in results.values()), results
        assert all(holds(region, slot, key) for slot, key in enumerate(KEYS))
    finally:
        tier.close()
    assert server.peer_server.stats()["fetch_unpinned"] > 0


def test_a_renewed_hold_keeps_its_first_deadline_and_owners_stay_apart():
    host, keys = HostTier(16), make_keys(IDENTITY, 12)
    host.allocate(keys)
    host.complete_write(keys, success=True)
    peer_holds = PeerHolds(16, hold_timeout_s=1.0)
    assert (peer_holds.per_client, peer_holds.total) == (4, 8)
    first = peer_holds.take(host, b"a", keys[:1], now=10.0)
    renewed = peer_holds.take(host, b"a", keys[:2], now=10.9)
    assert first.deadline == renewed.deadline == 11.0, "a renewal never extends a deadline"
    assert peer_holds.take(host, b"a", keys, now=11.0).keys == keys[:1], "a's budget: 4"
    assert peer_holds.take(host, b"b", keys, now=11.0).keys == keys[:4], "b's own budget"
    assert peer_holds.take(host, b"c", keys, now=11.0).keys == [], "all clients: 8"
    peer_holds.give_back(host, b"c", keys[:1])  # c holds nothing: nothing changes
    assert peer_holds.counters["release_mismatch"] == 1
    assert sorted(host.holds_of(owner_of(b"a"))) == sorted([keys[0], keys[0], keys[1], keys[0]])
    peer_holds.give_back(host, b"a", host.holds_of(owner_of(b"a")))
    peer_holds.give_back(host, b"b", host.holds_of(owner_of(b"b")))
    assert host.num_held == 0 and peer_holds.held == 0


@pytest.fixture
def curve_server(tmp_path: Path) -> Iterator[tuple[TieringManager, Path]]:
    """A CURVE server allowing alice and bob, whose holds last (30 s) through the test."""
    for name in ("server", "alice", "bob"):
        assert main(["peer", "keygen", "--out", str(tmp_path), "--name", name]) == 0
    (tmp_path / "clients").mkdir()
    for name in ("alice", "bob"):
        (tmp_path / "clients" / f"{name}.public").write_bytes(
            (tmp_path / f"{name}.public").read_bytes()
        )
    serve = {
        "port": free_port(),
        "hold_timeout_s": 30.0,
        "curve_secret_key_file": str(tmp_path / "server.secret"),
        "curve_client_keys_dir": str(tmp_path / "clients"),
    }
    manager = TieringManager(config(SLOTS, LAYOUT, serve=serve), IDENTITY)
    assert store(manager, KEYS)
    yield manager, tmp_path
    manager.close()


def test_connections_with_one_curve_key_share_its_budget(curve_server):
    """Budget 8 of 32 slots per client: three connections with alice's key hold 8 slots
    together, not 8 each; bob's key has a budget of its own."""
    server, keys = curve_server
    assert server.peer_server is not None
    port, public = server.peer_server.port, keys / "server.public"

    def stat(name: str) -> int:
        return int(server.peer_server.stats().get(name, 0))

    hoarders = [Hoarder(port, (keys / "alice.secret", public)) for _ in range(3)]
    try:
        wait_for(
            lambda: min(h.sent for h in hoarders) > 10 and stat("fetched_chunks") > 30 * SLOTS,
            timeout=30,
            what="every alice connection being served",
        )
        held: list[int] = []  # sampled until the budget is full: it is never exceeded
        wait_for(lambda: held.append(stat("peer_held_slots")) or held[-1] == 8, timeout=30)
        assert max(held) == 8, "connections of one key took more than its budget"
        hoarders.append(Hoarder(port, (keys / "bob.secret", public)))
        wait_for(lambda: stat("peer_held_slots") == 16, timeout=30, what="bob's own budget")
    finally:
        for hoarder in hoarders:
            hoarder.stop()


def test_connections_sharing_a_budget_name_share_its_slots_until_they_give_them_back():
    host, keys = HostTier(16), make_keys(IDENTITY, 8)
    host.allocate(keys)
    host.complete_write(keys, success=True)
    peer_holds = PeerHolds(16, hold_timeout_s=1.0)  # 4 per client, 8 for all
    assert len(peer_holds.take(host, b"a1", keys, 10.0, b"alice").keys) == 4
    assert peer_holds.take(host, b"a2", keys, 10.0, b"alice").keys == []
    peer_holds.give_back(host, b"a1", keys[:3])
    assert peer_holds.take(host, b"a2", keys, 10.0, b"alice").keys == keys[:3]
    assert peer_holds.held == 4 and host.holds_of(owner_of(b"a1")) == [keys[3]]
