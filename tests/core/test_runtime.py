"""Runtime, the core both engine paths compose, driven directly the way the vLLM adapter does:
tiers added one at a time, jobs polled per tier, the guard fed from them, a tier retired."""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from kvtier.config import MemoryTierConfig, RuntimeConfig
from kvtier.control.slo_guard import SLOGuardConfig
from kvtier.core.runtime import Runtime
from kvtier.core.tier_set import Retired
from kvtier.errors import ClosedError
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import MISS
from kvtier.tiers.fault import FaultInjectingTier
from kvtier.tiers.memory import MemoryTier

CHUNK = 4096


def key(i: int) -> ChunkKey:
    return ChunkKey(i.to_bytes(32, "big"))


@pytest.fixture
def region():
    return HostRegion(8, CHUNK)


def memory(region, identity, name="mem"):
    return MemoryTier(MemoryTierConfig(capacity_bytes=1 << 20, name=name), region, identity)


def wait_finished(runtime: Runtime, index: int, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        finished, _ = runtime.poll_tier(index)
        if finished:
            return finished
        time.sleep(0.01)
    raise AssertionError("no job reported")


def test_a_slow_promotion_polled_per_tier_trips_the_guard_and_only_that_tier(region, identity):
    guard = SLOGuardConfig(promotion_p99_s=0.05, min_samples=1, sustain_s=0.001, window_s=60)
    runtime = Runtime(RuntimeConfig(slo_guard=guard), CHUNK)
    slow = FaultInjectingTier(memory(region, identity), delay_s=0.2, name="slow")
    fast = runtime.add_tier(memory(region, identity, "fast"))
    index = runtime.add_tier(slow)
    runtime.bind()
    assert runtime.tiers.submit(index, "store", [key(1)], [0], owner="job-1") is None
    assert wait_finished(runtime, index)[0].job.owner == "job-1"
    assert runtime.tiers.lookup(index, key(1)) is not MISS
    runtime.tiers.submit(index, "load", [key(1)], [1])
    wait_finished(runtime, index)
    runtime.poll_tier(fast)  # the guard decides at any tier's poll: broken from now...
    time.sleep(0.01)
    runtime.poll_tier(fast)  # ...and for longer than sustain_s
    assert runtime.tier_states() == (["fast"], ["slow"])
    assert [s.reason for s in runtime.take_tier_switches()] == ["promotion_p99"]
    runtime.close()


def test_a_retired_tier_is_dropped_switched_off_and_its_jobs_forgotten(region, identity):
    runtime = Runtime(RuntimeConfig(), CHUNK)
    tier = FaultInjectingTier(memory(region, identity), delay_s=5.0, name="gone")
    index = runtime.add_tier(tier)
    runtime.add_tier(memory(region, identity, "kept"))
    runtime.bind()
    runtime.tiers.submit(index, "store", [key(1)], [0])
    assert runtime.tiers.num_pending_of(index) == 1
    tier.close()
    ref = weakref.ref(tier)
    assert runtime.tiers.retire(index) is tier
    del tier
    gc.collect()
    assert ref() is None  # nothing of the runtime's keeps the closed tier (nor its region views)
    assert runtime.tiers.num_pending_of(index) == 0
    assert runtime.tier_states() == (["kept"], ["gone"])
    assert isinstance(runtime.tiers[index], Retired) and runtime.tiers[index].lookup(key(1)) is MISS
    assert runtime.tiers.submit(index, "load", [key(1)], [0]) is not None  # refused, reported
    runtime.close()


def test_names_stay_unique_as_tiers_join_one_at_a_time(region, identity):
    runtime = Runtime(RuntimeConfig(), CHUNK)
    for _ in range(3):
        runtime.add_tier(Retired("fs"))
        runtime.bind()
    assert runtime.tiers.names() == ["fs#0", "fs#1", "fs#2"]


def test_a_closed_runtime_refuses_tiers_and_switches(region, identity):
    runtime = Runtime(RuntimeConfig(), CHUNK)
    runtime.add_tier(Retired("fs"))
    runtime.bind()
    runtime.close()
    runtime.close()  # idempotent
    with pytest.raises(ClosedError):
        runtime.disable_tier("fs")
    with pytest.raises(ClosedError):
        runtime.add_tier(Retired("more"))


@pytest.mark.parametrize("fail_load", [True, False])
def test_a_fast_promotion_that_fails_counts_as_over_budget_and_one_that_succeeds_does_not(
    region, identity, fail_load
):
    guard = SLOGuardConfig(promotion_p99_s=5.0, min_samples=1, sustain_s=0.001, window_s=60)
    runtime = Runtime(RuntimeConfig(slo_guard=guard), CHUNK)
    index = runtime.add_tier(FaultInjectingTier(memory(region, identity), fail_load=fail_load))
    runtime.bind()
    runtime.tiers.submit(index, "store", [key(1)], [0])
    wait_finished(runtime, index)
    runtime.tiers.submit(index, "load", [key(1)], [1])
    assert bool(wait_finished(runtime, index)[0].failed) is fail_load
    for _ in range(2):
        time.sleep(0.01)
        runtime.poll_tier(index)
    assert runtime.tier_states()[1] == (["fault(mem)"] if fail_load else [])
    runtime.close()


def test_a_tiers_counters_for_vllms_metrics_are_its_counter_series_only():
    runtime = Runtime(RuntimeConfig(), CHUNK)
    metrics = runtime.metrics
    metrics.count("tier_chunks", 3, tier="fs", op="load", outcome="ok")
    metrics.count("tier_chunks", 5, tier="other", op="load", outcome="ok")
    metrics.count("admission_dropped", 2, tier="fs", reason="priority")
    metrics.count("tier_lookups", 0, tier="fs", result="hit")  # zero: left out
    metrics.telemetry.observe("kvtier_tier_job_seconds", 0.1, tier="fs", op="load")  # histogram
    assert metrics.counters_of("fs") == {
        "tier_chunks:op=load:outcome=ok": 3,
        "admission_dropped:reason=priority": 2,
    }
