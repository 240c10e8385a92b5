"""The p2p tier between real processes: byte-identical loads, batching, refusals, dead and
restarted peers, hints, and the peer tier alongside the filesystem tier."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from kvtier import RETRY, CacheIdentity, TieringManager
from kvtier.config import P2PTierConfig
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.telemetry.kv_events import EventKind
from kvtier.tiers.base import HIT, MISS, TransferJob
from kvtier.tiers.peer.tier import PeerTier
from tests.conftest import collect, config, fill, holds, make_keys, settle_lookup, wait_for
from tests.tiers.peer_node import PeerNode
from tests.tiers.s3_server import free_port


@pytest.fixture
def region(identity: CacheIdentity) -> HostRegion:
    return HostRegion(32, identity.layout.chunk_bytes)


@pytest.fixture(params=["zmq", "tcp"])
def producer(request: pytest.FixtureRequest) -> Iterator[PeerNode]:
    """Another process that stored the 8 chunks of ``make_keys(identity, 8)`` and serves them,
    over each transport."""
    node = PeerNode(0, "--store", "8", "--transport", request.param).start()
    yield node
    node.kill()


def settle(manager: TieringManager, keys: list[ChunkKey], timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while (n := manager.lookup(keys)) is RETRY:
        assert time.monotonic() < deadline, "lookup kept answering RETRY"
        time.sleep(0.002)
    assert isinstance(n, int)
    return n


def p2p(port: int, **options: object) -> dict[str, object]:
    return {"type": "p2p", "host": "127.0.0.1", "port": port, **options}


def test_chunks_stored_by_one_process_load_byte_identical_in_another(producer, identity):
    """The consumer's manager promotes every chunk from the producer's host memory."""
    keys = make_keys(identity, 8)
    with TieringManager(
        config(16, secondary_tiers=[p2p(producer.port, transport=producer.transport)]), identity
    ) as m:
        assert settle(m, keys) == 8
        slots = m.prepare_load(keys)
        assert all(holds(m.region, slot, key) for key, slot in zip(keys, slots))
        m.complete_load(keys)
        stats = m.tiers[0].stats()
    assert stats["fetched_chunks"] == 8
    assert stats.get("fetched_chunks_copied", 0) == 0, "each payload lands in its slot"
    assert stats["lookup_messages"] < len(keys), "one request's lookups travel together"


def test_unknown_chunks_are_misses_and_the_prefix_stops_there(producer, identity):
    keys = make_keys(identity, 8)[:4] + make_keys(identity, 2, seed=77)
    with TieringManager(
        config(16, secondary_tiers=[p2p(producer.port, transport=producer.transport)]), identity
    ) as m:
        assert settle(m, keys) == 4


def test_a_peer_of_another_cache_identity_is_refused_and_logged(identity, region, caplog):
    node = PeerNode(0, "--store", "2", "--model", "other/model").start()
    tier = node.tier(region, identity)
    try:
        with caplog.at_level(logging.ERROR, logger="kvtier.tiers.peer.link"):
            assert settle_lookup(tier, make_keys(identity, 1)[0]) is MISS
        assert tier.stats()["handshakes_refused"] >= 1
        assert "cache identity" in caplog.text
    finally:
        tier.close()
        node.kill()


def test_a_dead_peer_costs_a_timeout_then_misses(identity, region):
    tier = PeerNode(free_port()).tier(region, identity, timeout_s=0.3)
    try:
        keys = make_keys(identity, 2)
        assert settle_lookup(tier, keys[0]) is MISS
        tier.submit_load(TransferJob(1, tuple(keys), (0, 1)))
        assert collect(tier, [1])[1].failed == frozenset(keys)
        assert not tier.available
    finally:
        tier.close()


def test_producer_killed_mid_fetch_then_restarted(producer, identity, region):
    """SIGKILL while a fetch waits for its reply: misses within the timeout, then a reconnect."""
    keys = make_keys(identity, 8)
    tier = producer.tier(region, identity, timeout_s=1.0)
    try:
        assert all(settle_lookup(tier, key) is HIT for key in keys)
        producer.freeze()  # the fetch goes out but is never answered
        tier.submit_load(TransferJob(1, tuple(keys), tuple(range(8))))
        time.sleep(0.2)
        producer.kill()
        result = collect(tier, [1], timeout=10)[1]
        assert result.succeeded == frozenset() and result.failed == frozenset(keys)
        assert settle_lookup(tier, keys[0]) is MISS
        assert tier.stats()["peer_failures"] >= 1

        restarted = PeerNode(producer.port, *producer.args).start()
        try:
            wait_for(lambda: settle_lookup(tier, keys[0]) is HIT, timeout=30)
            region.numpy(20)[:] = 0
            tier.submit_load(TransferJob(2, (keys[0],), (20,)))
            assert collect(tier, [2])[2].succeeded == {keys[0]}
            assert holds(region, 20, keys[0])
        finally:
            restarted.kill()
    finally:
        tier.close()


def test_a_hint_names_a_peer_outside_the_config(producer, identity, region):
    """The configured peer holds nothing; the hinted one does, and serves the load."""
    empty = PeerNode(0, "--transport", producer.transport).start()
    tier = empty.tier(region, identity)
    try:
        keys = make_keys(identity, 8)
        tier.hint(keys[:2], "127.0.0.1", producer.port)
        assert settle_lookup(tier, keys[0]) is HIT
        assert settle_lookup(tier, make_keys(identity, 1, seed=9)[0]) is MISS
        tier.submit_load(TransferJob(1, tuple(keys[:2]), (3, 4)))
        assert collect(tier, [1])[1].succeeded == frozenset(keys[:2])
        assert holds(region, 3, keys[0]) and holds(region, 4, keys[1])
    finally:
        tier.close()
        empty.kill()


def test_a_peer_that_does_not_accept_stores_fails_them(producer, identity, region):
    keys = make_keys(identity, 2, seed=5)
    tier = producer.tier(region, identity)
    try:
        settle_lookup(tier, keys[0])  # the handshake has been answered
        tier.submit_store(TransferJob(1, tuple(keys), (0, 1)))
        result = collect(tier, [1])[1]
        assert result.succeeded == frozenset() and result.failed == frozenset(keys)
    finally:
        tier.close()


def test_the_tier_learns_from_each_handshake_whether_stores_are_accepted(
    producer, p2p_server, identity, region
):
    refusing, accepting = producer.tier(region, identity), p2p_server.tier(region, identity)
    try:
        wait_for(lambda: accepting.accepts_stores, timeout=20, what="an accepting peer's hello")
        assert settle_lookup(refusing, make_keys(identity, 1)[0]) is HIT  # its hello answered
        assert not refusing.accepts_stores
    finally:
        refusing.close()
        accepting.close()


def test_a_store_for_a_peer_that_refuses_stores_never_leaves_this_process(identity, region):
    """Submitted before the handshake is answered, so it waits for it; then fails here."""
    with TieringManager(config(8, serve={"port": free_port()}), identity) as server:
        assert server.peer_server is not None
        p2p_config = P2PTierConfig(host="127.0.0.1", port=server.peer_server.port)
        tier = PeerTier(p2p_config, region, identity)
        try:
            keys = make_keys(identity, 2, seed=5)
            tier.submit_store(TransferJob(1, tuple(keys), (0, 1)))
            assert collect(tier, [1])[1].failed == frozenset(keys)
            assert tier.stats()["stores_not_accepted"] == 1
            assert settle_lookup(tier, make_keys(identity, 1, seed=6)[0]) is MISS  # still up
            assert tier.stats().get("peer_failures", 0) == 0
        finally:
            tier.close()
        stats = server.peer_server.stats()
    assert "stores_refused" not in stats and "messages_dropped_oversized" not in stats


def test_peers_that_refuse_stores_get_no_write_through_and_no_failure(producer, identity):
    keys = make_keys(identity, 4, seed=11)
    with TieringManager(
        config(16, secondary_tiers=[p2p(producer.port, transport=producer.transport)]), identity
    ) as m:
        assert settle(m, make_keys(identity, 1)) == 1  # the peer's handshake was answered
        plan = m.prepare_store(keys)
        assert plan is not None
        for key, slot in zip(plan.keys, plan.slots):
            fill(m.region, slot, key)
        m.complete_store(plan.keys)
        assert m.wait_idle(timeout=20)
        counters = m.stats()["counters"]
    stores = {name: n for name, n in counters.items() if "op=store" in name and "tier=p2p" in name}
    assert stores == {}, f"write-through to peers that refuse stores: {stores}"


def test_one_request_is_served_by_the_filesystem_and_a_peer(identity, tmp_path):
    """The first half of a prefix is in the local filesystem tier, the rest in a peer's host."""
    keys = make_keys(identity, 8)
    fs = {"type": "fs", "root_dir": str(tmp_path)}
    with TieringManager(config(16, secondary_tiers=[fs]), identity) as writer:
        plan = writer.prepare_store(keys[:4])
        for key, slot in zip(plan.keys, plan.slots):
            fill(writer.region, slot, key)
        writer.complete_store(plan.keys)
        assert writer.wait_idle(timeout=20)
    node = PeerNode(0, "--store", "8", "--skip", "4").start()
    try:
        tiers = [fs, p2p(node.port)]
        with TieringManager(config(16, secondary_tiers=tiers), identity) as m:
            assert settle(m, keys) == 8
            slots = m.prepare_load(keys)
            assert all(holds(m.region, slot, key) for key, slot in zip(keys, slots))
            m.complete_load(keys)
            sources = {e.source for e in m.take_events() if e.kind is EventKind.PROMOTED}
    finally:
        node.kill()
    assert len(sources) == 2
