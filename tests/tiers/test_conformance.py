"""The SecondaryTier contract, run against every tier in ``CONFORMING_TIERS``."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from kvtier.identity import CacheIdentity
from kvtier.region import HostRegion
from kvtier.tiers.base import HIT, MISS, SecondaryTier, TransferJob
from tests.conftest import collect, fill, holds, make_keys, settle_lookup
from tests.tiers.conftest import TierFactory

NUM_SLOTS = 64


@pytest.fixture
def region(identity: CacheIdentity) -> HostRegion:
    return HostRegion(NUM_SLOTS, identity.layout.chunk_bytes)


@pytest.fixture
def tier(
    tier_factory: TierFactory, region: HostRegion, identity: CacheIdentity
) -> Iterator[SecondaryTier]:
    tier = tier_factory(region, identity)
    yield tier
    tier.close()


def store(
    tier: SecondaryTier, region: HostRegion, keys: list, first_slot: int, job_id: int
) -> None:
    slots = tuple(range(first_slot, first_slot + len(keys)))
    for key, slot in zip(keys, slots):
        fill(region, slot, key)
    tier.submit_store(TransferJob(job_id, tuple(keys), slots))
    result = collect(tier, [job_id])[job_id]
    assert result.op == "store" and result.succeeded == frozenset(keys) and result.ok


def test_stored_chunks_load_back_byte_identical(tier, region, identity):
    keys = make_keys(identity, 4)
    store(tier, region, keys, first_slot=0, job_id=1)
    for key in keys:
        assert settle_lookup(tier, key) is HIT
    load_slots = tuple(range(10, 14))
    region.numpy(10)[:] = 0
    tier.submit_load(TransferJob(2, tuple(keys), load_slots))
    result = collect(tier, [2])[2]
    assert result.op == "load" and result.succeeded == frozenset(keys)
    assert all(holds(region, slot, key) for key, slot in zip(keys, load_slots))


def test_unknown_key_settles_to_miss(tier, identity):
    (key,) = make_keys(identity, 1, seed=99)
    assert settle_lookup(tier, key) is MISS


def test_load_reports_exactly_which_keys_arrived(tier, region, identity):
    present = make_keys(identity, 2, seed=1)
    absent = make_keys(identity, 2, seed=2)
    store(tier, region, present, first_slot=0, job_id=7)
    keys = (present[0], absent[0], present[1], absent[1])
    tier.submit_load(TransferJob(8, keys, (20, 21, 22, 23)))
    result = collect(tier, [8])[8]
    assert result.succeeded == frozenset(present)
    assert result.failed == frozenset(absent)
    assert holds(region, 20, present[0]) and holds(region, 22, present[1])


def test_many_concurrent_jobs_each_report_once(tier, region, identity):
    keys = make_keys(identity, 32, seed=3)
    for slot, key in enumerate(keys):
        fill(region, slot, key)
    for job in range(8):
        part = slice(job * 4, job * 4 + 4)
        tier.submit_store(TransferJob(100 + job, tuple(keys[part]), tuple(range(64)[part])))
    results = collect(tier, range(100, 108))
    assert all(r.ok and r.op == "store" for r in results.values())
    tier.submit_load(TransferJob(200, tuple(keys), tuple(range(32, 64))))
    result = collect(tier, [200])[200]
    assert result.succeeded == frozenset(keys)
    assert all(holds(region, 32 + i, key) for i, key in enumerate(keys))
    assert tier.get_finished_jobs() == []


def test_storing_the_same_key_twice_is_harmless(tier, region, identity):
    keys = make_keys(identity, 1, seed=4)
    store(tier, region, keys, first_slot=0, job_id=1)
    store(tier, region, keys, first_slot=1, job_id=2)
    tier.submit_load(TransferJob(3, tuple(keys), (5,)))
    assert collect(tier, [3])[3].succeeded == frozenset(keys)
    assert holds(region, 5, keys[0])


def test_close_joins_every_thread(tier_factory, region, identity):
    before = set(threading.enumerate())
    tier = tier_factory(region, identity)
    store(tier, region, make_keys(identity, 2, seed=5), first_slot=0, job_id=1)
    tier.close()
    leftover = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert leftover == []
