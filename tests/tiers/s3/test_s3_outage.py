"""Outages of the object store: down at start, frozen mid-run, killed and restarted.

Each test owns a moto server process. "No request hangs" is checked as: every lookup settles and
every job reports within a bound that is a generous multiple of the tier's ``timeout_s`` (1 s).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from kvtier import CacheIdentity, TieringManager
from kvtier.region import HostRegion
from kvtier.tiers.base import MISS, TransferJob
from tests.conftest import collect, config, fill, holds, make_keys, wait_for
from tests.tiers.s3.s3_workload import BOUND_S, served_intact, store
from tests.tiers.s3_server import ACCESS_KEY, SECRET_KEY, MotoServer

FAST_RECOVERY = {
    "timeout_s": 1.0,
    "circuit_failures": 2,
    "reconnect_min_s": 0.1,
    "reconnect_max_s": 0.5,
}


@pytest.fixture
def server() -> Iterator[MotoServer]:
    server = MotoServer().start()
    server.create_bucket("kvtier")
    yield server
    server.stop()


def obj_entry(server: MotoServer) -> dict[str, Any]:
    return {
        "type": "obj",
        "bucket": "kvtier",
        "endpoint_override": server.endpoint,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "io_threads": 4,
        "prefix": "outage",
        **FAST_RECOVERY,
    }


def obj_stats(manager: TieringManager) -> dict[str, int]:
    stats: dict[str, int] = manager.stats()["tiers"]["obj"]
    return stats


def in_bucket(server: MotoServer, identity: CacheIdentity, keys: list) -> bool:
    """A fresh manager with only the object tier loads every key intact."""
    with TieringManager(config(len(keys), secondary_tiers=[obj_entry(server)]), identity) as m:
        return served_intact(m, keys)


def test_endpoint_down_at_start_then_connects(identity, caplog):
    """Down at start: a warning, MISS, dropped stores; once the server is up it connects."""
    server = MotoServer()
    region = HostRegion(4, identity.layout.chunk_bytes)
    with caplog.at_level(logging.WARNING):
        tier = server.tier("kvtier", region, identity, **FAST_RECOVERY)
    try:
        assert "starts unavailable" in caplog.text
        (key,) = make_keys(identity, 1, seed=30)
        assert tier.lookup(key) is MISS
        fill(region, 0, key)
        tier.submit_store(TransferJob(1, (key,), (0,)))
        assert not collect(tier, [1], timeout=BOUND_S)[1].ok
        assert tier.stats()["store_dropped"] == 1 and tier.stats()["circuit_state"] == 1
        server.start()
        server.create_bucket("kvtier")
        wait_for(lambda: tier.stats()["circuit_state"] == 0, timeout=BOUND_S)
        tier.submit_store(TransferJob(2, (key,), (0,)))
        assert collect(tier, [2], timeout=BOUND_S)[2].ok
        tier.submit_load(TransferJob(3, (key,), (1,)))
        assert collect(tier, [3], timeout=BOUND_S)[3].succeeded == {key}
        assert holds(region, 1, key)
    finally:
        tier.close()
        server.stop()


def test_frozen_server_opens_the_circuit_and_the_manager_keeps_serving(server, identity):
    """SIGSTOP mid-workload: requests time out, the circuit opens, host and memory still serve;
    after SIGCONT the circuit closes and the bucket still holds what was stored before."""
    cfg = config(4, secondary_tiers=[obj_entry(server), {"type": "memory"}])
    before, during, after = (make_keys(identity, 8, seed=s) for s in (31, 32, 33))
    with TieringManager(cfg, identity) as manager:
        store(manager, before[:4])
        store(manager, before[4:])  # evicts before[:4] from host: obj and memory hold them
        server.freeze()
        try:
            assert served_intact(manager, before[:4])
            store(manager, during[:4])
            stats = obj_stats(manager)
            assert stats["circuit_state"] == 1
            assert stats.get("store_dropped", 0) + stats.get("store_failed", 0) >= 1
            assert manager.tiers[0].lookup(during[5]) is MISS
        finally:
            server.thaw()
        wait_for(lambda: obj_stats(manager)["circuit_state"] == 0, timeout=BOUND_S)
        store(manager, after[:4])
        assert obj_stats(manager)["store_ok"] >= 8
    assert in_bucket(server, identity, before[:4]) and in_bucket(server, identity, after[:4])


def test_killed_server_turns_lookups_into_misses_and_recovers_after_restart(server, identity):
    """Kill mid-workload: lookups settle (memory tier serves), stores are dropped; restart on
    the same port: the circuit closes and new chunks reach the bucket again."""
    cfg = config(4, secondary_tiers=[obj_entry(server), {"type": "memory"}])
    before, during, after = (make_keys(identity, 8, seed=s) for s in (41, 42, 43))
    with TieringManager(cfg, identity) as manager:
        store(manager, before[:4])
        store(manager, before[4:])
        server.stop()
        assert served_intact(manager, before[:4])
        store(manager, during[:4])
        wait_for(lambda: obj_stats(manager)["circuit_state"] == 1, timeout=BOUND_S)
        store(manager, during[4:])
        assert obj_stats(manager)["store_dropped"] >= 4
        assert manager.tiers[0].lookup(during[0]) is MISS
        server.start()
        server.create_bucket("kvtier")
        wait_for(lambda: obj_stats(manager)["circuit_state"] == 0, timeout=BOUND_S)
        store(manager, after[:4])
    assert in_bucket(server, identity, after[:4])
