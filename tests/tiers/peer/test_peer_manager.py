"""The manager with peers in one process: start-up order, and where events say chunks came from.

Both the serving manager (``serve``) and the client (a ``p2p`` tier) run here, over real ZeroMQ
sockets on 127.0.0.1.
"""

from __future__ import annotations

import socket
import time

import pytest

from kvtier import MISS, RETRY, TieringManager
from kvtier.config import P2PTierConfig
from kvtier.core import promotion as promotion_module
from kvtier.region import HostRegion
from kvtier.telemetry.kv_events import EventKind
from kvtier.tiers.peer.tier import PeerTier
from tests.conftest import config, make_keys, read, settle, store, wait_for


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_peer_asking_while_the_server_starts_is_answered_not_failed(identity, monkeypatch):
    """A lookup that reaches the server while its manager is still being built.

    The client asks first (ZeroMQ queues the request until the server binds); the server's
    construction is slowed down at its promoter, which used to be built after the peer server's
    driver thread had started. That thread then polled a half-built manager: the request failed
    and the client marked the peer down. Services now start only once construction is over.
    """
    original = promotion_module.Promoter.__init__

    def slow_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(0.5)
        original(self, *args, **kwargs)

    port = unused_port()
    key = make_keys(identity, 1, seed=5)[0]
    region = HostRegion(4, identity.layout.chunk_bytes)
    client = PeerTier(P2PTierConfig(host="127.0.0.1", port=port, timeout_s=10.0), region, identity)
    try:
        assert client.lookup(key) is RETRY
        monkeypatch.setattr(promotion_module.Promoter, "__init__", slow_init)
        with TieringManager(config(4, serve={"port": port}), identity) as server:
            deadline = time.monotonic() + 20
            while (answer := client.lookup(key)) is RETRY:
                assert time.monotonic() < deadline, "the peer never answered"
                time.sleep(0.01)
            other = make_keys(identity, 1, seed=6)[0]
            wait_for(lambda: client.lookup(other) is not RETRY and client.available, timeout=30)
            counters = server.stats()["counters"]
        assert answer is MISS
        assert not any(name.startswith("kvtier_internal_errors") for name in counters)
    finally:
        client.close()


@pytest.fixture
def serving(identity):
    """A manager serving 4 stored chunks to peers."""
    port = unused_port()
    with TieringManager(config(8, serve={"port": port}), identity) as server:
        store(server, make_keys(identity, 4))
        yield port


def test_a_chunk_fetched_from_a_peer_is_a_remote_event(serving, identity):
    keys = make_keys(identity, 4)
    p2p = {"type": "p2p", "host": "127.0.0.1", "port": serving, "timeout_s": 10.0}
    with TieringManager(config(8, secondary_tiers=[p2p]), identity) as client:
        assert settle(client, keys, timeout=20) == 4
        assert read(client, keys)
        promoted = [e for e in client.take_events() if e.kind is EventKind.PROMOTED]
    assert len(promoted) == 4
    assert {e.locality for e in promoted} == {"remote"}
