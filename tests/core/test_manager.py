"""TieringManager scenarios: write-through, promotion, failures, and shutdown."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from kvtier import RETRY, ConfigError, KVTierError, TieringConfig, TieringManager
from kvtier.config import MemoryTierConfig
from kvtier.errors import InvalidArgumentError
from kvtier.region import HostRegion
from kvtier.telemetry.kv_events import EventKind
from kvtier.tiers.fault import FaultInjectingTier
from kvtier.tiers.memory import MemoryTier
from tests.conftest import config, make_keys, push_out, read, settle, store


@pytest.fixture
def build(identity):
    """``build(slots, *tiers)``: a manager whose tiers are built lazily from factories."""
    managers = []

    def make(num_slots, *wrappers, policy="lru"):
        factories = [memory_tier_factory(w) for w in wrappers]
        manager = TieringManager(
            config(num_slots, eviction_policy=policy), identity, tiers=factories
        )
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.close()


def memory_tier_factory(wrap):
    return lambda region, identity: wrap(MemoryTier(MemoryTierConfig(), region, identity))


def plain(tier):
    return tier


def faulty(**faults):
    return lambda tier: FaultInjectingTier(tier, **faults)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_host_round_trip(build, identity, policy):
    m = build(8, policy=policy)
    keys = make_keys(identity, 4)
    store(m, keys)
    assert m.lookup(keys) == 4 and read(m, keys)
    assert m.prepare_store(keys).keys == []


def test_prepare_store_returns_none_when_every_slot_is_held(build, identity):
    m = build(2)
    keys = make_keys(identity, 2)
    store(m, keys)
    m.prepare_load(keys)
    assert m.prepare_store(make_keys(identity, 1, seed=5)) is None
    assert m.metrics.telemetry.get("kvtier_store_rejected_total") == 1
    m.complete_load(keys)
    assert m.prepare_store(make_keys(identity, 1, seed=5)) is not None


def test_write_through_reaches_every_tier_and_holds_the_slot_meanwhile(build, identity):
    """A slow tier keeps the host slot from eviction until its copy is done."""
    m = build(2, plain, faulty(delay_s=0.3))
    keys = make_keys(identity, 2)
    store(m, keys)
    assert m.prepare_store(make_keys(identity, 1, seed=9)) is None
    assert m.wait_idle(10)
    assert all(t.lookup(k).value == "hit" for t in m.tiers for k in keys)
    assert m.prepare_store(make_keys(identity, 1, seed=9)) is not None


def test_failed_host_store_cascades_nothing(build, identity):
    m = build(4, faulty())
    keys = make_keys(identity, 2)
    store(m, keys, success=False)
    assert m.wait_idle(5)
    assert m.tiers[0].calls["store"] == 0 and m.lookup(keys) == 0
    assert m.host.num_free == 4


def test_failed_cascade_to_one_tier_does_not_affect_the_others(build, identity):
    m = build(2, faulty(fail_store=True), plain)
    keys = make_keys(identity, 2)
    store(m, keys)
    push_out(m, identity, 2)
    assert settle(m, keys) == 2 and read(m, keys)
    promoted = [e for e in m.take_events() if e.kind is EventKind.PROMOTED]
    assert {e.source for e in promoted} == {m.tiers[1].name}


def test_promotion_answers_retry_then_serves_identical_bytes(build, identity):
    m = build(4, faulty(delay_s=0.05))
    keys = make_keys(identity, 4)
    store(m, keys)
    push_out(m, identity, 4)
    assert m.lookup(keys) is RETRY
    assert settle(m, keys) == 4 and read(m, keys)


def test_two_requests_for_the_same_chunk_cause_one_promotion(build, identity):
    m = build(4, faulty(delay_s=0.05))
    keys = make_keys(identity, 2)
    store(m, keys)
    push_out(m, identity, 4)
    assert m.lookup(keys) is RETRY
    assert m.lookup(keys[:1]) is RETRY
    assert settle(m, keys) == 2 and settle(m, keys[:1]) == 1
    assert m.tiers[0].calls["load"] == 1


def test_partly_failed_promotion_keeps_successes_and_does_not_loop(build, identity):
    keys = make_keys(identity, 4)
    m = build(4, faulty(fail_keys=[keys[2]]))
    store(m, keys)
    push_out(m, identity, 4)
    assert settle(m, keys) == 2 and read(m, keys[:2])
    loads = m.tiers[0].calls["load"]
    for _ in range(5):
        assert settle(m, keys) == 2
    assert m.tiers[0].calls["load"] == loads
    assert (
        m.metrics.telemetry.get(
            "kvtier_tier_chunks_total", tier=m.tiers[0].name, op="load", outcome="failed"
        )
        == 1
    )


def test_a_chunk_stored_anew_may_be_promoted_again(build, identity):
    keys = make_keys(identity, 1)
    fault = faulty(fail_load=True)
    m = build(1, fault)
    store(m, keys)
    push_out(m, identity, 1)
    assert settle(m, keys) == 0
    m.tiers[0].fail_load = False
    store(m, keys)
    push_out(m, identity, 1, seed=2000)
    assert settle(m, keys) == 1 and read(m, keys)


def test_chunks_of_one_request_come_from_different_tiers(build, identity):
    keys = make_keys(identity, 4)
    m = build(4, faulty(fail_keys=keys[2:]), plain)
    store(m, keys)
    push_out(m, identity, 4)
    assert settle(m, keys) == 4 and read(m, keys)
    sources = {e.key: e.source for e in m.take_events() if e.kind is EventKind.PROMOTED}
    first, second = m.tiers[0].name, m.tiers[1].name
    assert [sources[k] for k in keys] == [first, first, second, second]


def test_prepare_load_counts_each_chunk_by_where_it_came_from(build, identity):
    """``sources`` gets one count per chunk: the promoting tier's name, then ``host`` once the
    promotion was used; a ``sources`` that is not a Counter is refused before anything moves."""
    keys = make_keys(identity, 4)
    m = build(4, faulty(fail_keys=keys[2:]), plain)
    store(m, keys)
    push_out(m, identity, 4)
    assert settle(m, keys) == 4
    with pytest.raises(InvalidArgumentError):
        m.prepare_load(keys, {})  # a dict's update would replace counts, not add them
    sources = Counter({"earlier": 1})
    m.prepare_load(keys, sources)
    m.complete_load(keys)
    assert sources == {"earlier": 1, m.tiers[0].name: 2, m.tiers[1].name: 2}
    again = Counter[str]()
    m.prepare_load(keys[:3], again)
    m.complete_load(keys[:3])
    assert again == {"host": 3}


def test_first_tier_in_configured_order_serves(build, identity):
    m = build(2, faulty(), faulty())
    keys = make_keys(identity, 2)
    store(m, keys)
    push_out(m, identity, 2)
    assert settle(m, keys) == 2
    assert (m.tiers[0].calls["load"], m.tiers[1].calls["load"]) == (1, 0)


@pytest.mark.parametrize("where", ["submit", "lookup"])
def test_a_tier_that_raises_is_a_failed_job_or_a_miss(build, identity, where):
    m = build(2, faulty(), plain)
    keys = make_keys(identity, 2)
    setattr(m.tiers[0], f"raise_in_{where}", True)
    store(m, keys)
    assert m.wait_idle(5)
    name = m.tiers[0].name
    if where == "submit":
        assert (
            m.metrics.telemetry.get(
                "kvtier_tier_chunks_total", tier=name, op="store", outcome="failed"
            )
            == 2
        )
    push_out(m, identity, 2)
    assert settle(m, keys) == 2 and read(m, keys)
    if where == "lookup":
        assert m.metrics.telemetry.get("kvtier_tier_errors_total", tier=name, where="lookup") >= 1


def test_every_tier_failing_means_recompute_not_an_exception(build, identity):
    m = build(2, faulty(raise_in_submit=True, raise_in_lookup=True))
    keys = make_keys(identity, 2)
    store(m, keys)
    push_out(m, identity, 2)
    assert settle(m, keys) == 0


def test_lookup_answers_what_is_ready_when_every_slot_is_pinned(build, identity):
    m = build(2, plain)
    keys = make_keys(identity, 3)
    store(m, keys[:2])
    assert m.wait_idle(5)
    store(m, keys[2:])
    assert m.wait_idle(5)
    pinned = make_keys(identity, 2, seed=77)
    store(m, pinned)
    m.prepare_load(pinned)
    assert m.lookup(keys) == 0
    assert m.metrics.telemetry.get("kvtier_lookup_host_full_total") == 1
    m.complete_load(pinned)
    assert m.wait_idle(5)
    assert settle(m, keys) == 2


def test_an_engine_store_in_flight_is_not_ready(build, identity):
    m = build(4)
    keys = make_keys(identity, 2)
    store(m, keys[:1])
    m.prepare_store(keys[1:])
    assert m.lookup(keys) == 1


def test_prepare_load_rejects_chunks_not_in_host(build, identity):
    m = build(2)
    with pytest.raises(KVTierError, match="not ready"):
        m.prepare_load(make_keys(identity, 1))


def test_events_follow_the_chunk(build, identity):
    m = build(1, plain)
    (key,) = make_keys(identity, 1)
    store(m, [key])
    assert m.wait_idle(5)
    push_out(m, identity, 1)
    settle(m, [key])
    mine = [(e.kind, e.source, e.destination) for e in m.take_events() if e.key == key]
    tier = m.tiers[0].name
    assert mine == [
        (EventKind.STORED, "accelerator", "host"),
        (EventKind.WRITTEN, "host", tier),
        (EventKind.EVICTED, "host", None),
        (EventKind.PROMOTED, tier, "host"),
    ]
    assert m.take_events() == []


def test_close_drains_and_joins_every_thread(identity):
    before = set(threading.enumerate())
    m = TieringManager(
        config(4, secondary_tiers=[{"type": "memory"}, {"type": "memory"}]), identity
    )
    assert [t.name for t in m.tiers] == ["memory#0", "memory#1"]
    store(m, make_keys(identity, 3))
    m.close()
    assert m.num_pending_jobs == 0
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []
    m.close()


def test_host_memory_must_hold_a_chunk(identity):
    too_small = TieringConfig.from_dict({"cpu_bytes_to_use": 100})
    with pytest.raises(ConfigError, match="cpu_bytes_to_use: 100 bytes cannot hold one chunk"):
        TieringManager(too_small, identity)


@pytest.mark.parametrize("extra", [{"blocks_per_chunk": 3}, {"block_size": 12}, {"block_size": 5}])
def test_a_chunk_size_that_disagrees_with_the_layout_is_reported_and_the_layout_wins(
    identity, caplog, extra
):
    """The layout is part of the cache identity (it decides the keys), so it decides."""
    with TieringManager(config(2, **extra), identity) as m:
        assert m.region.slot_bytes == identity.layout.chunk_bytes
        store(m, make_keys(identity, 2))
        assert m.lookup(make_keys(identity, 2)) == 2
    assert "chunks follow the cache identity's layout" in caplog.text
    assert next(iter(extra)) in caplog.text


def test_a_chunk_size_that_agrees_is_silent(identity, caplog):
    TieringManager(config(2, block_size=identity.layout.tokens_per_chunk), identity).close()
    assert "layout" not in caplog.text


class CountingService:
    def __init__(self):
        self.steps, self.closed = 0, False

    def step(self, host):
        assert not isinstance(host, TieringManager), "services see a PeerHost, not the manager"
        assert host.busy is False and host.reserve([]) == ([], [])
        self.steps += 1

    def close(self):
        self.closed = True


def test_services_step_on_every_poll_and_close_with_the_manager(build):
    m = build(2)
    service = CountingService()
    m.add_service(service)
    m.poll()
    m.lookup([])
    assert service.steps == 2
    m.close()
    assert service.closed


def engine_counters(m):
    return [n for n in m.stats()["counters"] if n.startswith(("kvtier_lookups", "kvtier_recomp"))]


def test_promote_for_peer_brings_chunks_back_without_engine_metrics(build, identity):
    """A peer asks for chunks only the tier holds: they come back; no lookup is counted."""
    m = build(4, plain)
    old, new = make_keys(identity, 4), make_keys(identity, 2, seed=5)
    store(m, old)
    push_out(m, identity, 4)
    assert m.promote_for_peer([*old[:2], new[0]]) == set(old[:2])
    assert m.wait_idle(10)
    assert all(m.host.is_ready(k) for k in old[:2])
    assert engine_counters(m) == []


def test_promote_for_peer_never_evicts_held_chunks(build, identity):
    """Every slot is pinned by a reader: nothing is promoted, the readers keep their chunks."""
    m = build(4, plain)
    old = make_keys(identity, 2)
    store(m, old)
    pinned = make_keys(identity, 4, seed=1000)
    push_out(m, identity, 4)
    m.prepare_load(pinned)
    assert m.promote_for_peer(old) == set()
    m.complete_load(pinned)
    assert m.promote_for_peer([old[0], *pinned[:3]]) == {old[0]}, "the asked ready ones stay"
    assert all(m.host.is_ready(k) for k in pinned[:3])


def test_promote_for_peer_asks_no_failed_tier_and_no_peer_tier(build, identity):
    m = build(4, faulty(fail_load=True), plain)
    m.tiers[1].reads_peers = True  # stands in for a p2p tier
    keys = make_keys(identity, 1)
    store(m, keys)
    push_out(m, identity, 4)
    assert m.promote_for_peer(keys) == set(keys)
    assert m.wait_idle(10) and not m.host.is_ready(keys[0])
    assert m.promote_for_peer(keys) == set(), "a failed promotion is not retried for a peer"
    assert m.tiers[0].calls["load"] == 1


def test_tiers_from_factories_share_the_region_and_report_their_metrics(identity):
    """A factory's tier is built over the manager's region and bound to its telemetry."""
    keys = make_keys(identity, 2)
    with TieringManager(config(2), identity, tiers=[memory_tier_factory(plain)]) as m:
        assert m.tiers[0]._region is m.region
        store(m, keys)
        assert m.wait_idle(10)
        counters = m.stats()["counters"]
    assert counters["kvtier_tier_chunks_total{op=store,outcome=ok,tier=memory}"] == 2


def test_a_region_given_to_the_manager_is_used_and_must_hold_a_chunk(identity):
    region = HostRegion(3, identity.layout.chunk_bytes)
    with TieringManager(config(1), identity, region=region) as m:
        assert m.region is region and m.stats()["host"]["num_slots"] == 3
    with pytest.raises(ConfigError, match="region"):
        TieringManager(config(1), identity, region=HostRegion(1, 64))
