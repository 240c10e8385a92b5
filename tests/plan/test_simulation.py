"""The stack-distance simulation against brute force and against kvtier's real HostTier."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from kvtier.plan.analysis import PlanOptions, analyze
from kvtier.plan.curves import admitted_samples
from kvtier.plan.sim import replay_host_tier, simulate
from kvtier.plan.stack import build_stream, samples, stack_distances
from tests.plan.helpers import shared_prefixes


def brute_force(stream) -> list[int]:  # type: ignore[no-untyped-def]
    """Stack positions at each request's arrival, from an explicit LRU stack."""
    stack: OrderedDict[int, None] = OrderedDict()  # most recent last
    keys, starts, out = stream.keys.tolist(), stream.starts.tolist(), []
    for r in range(len(starts) - 1):
        order = list(reversed(stack))
        positions = {k: i for i, k in enumerate(order)}
        refs = keys[starts[r] : starts[r + 1]]
        out += [positions.get(k, float("inf")) for k in refs]
        for k in refs:
            stack.pop(k, None)
            stack[k] = None
    return out


def test_stack_distances_equal_a_brute_force_lru_stack() -> None:
    stream = build_stream(shared_prefixes(300))
    assert stack_distances(stream).tolist() == brute_force(stream)


@pytest.mark.parametrize("capacity", [6, 8, 13, 30, 60, 200])  # >= the longest request
def test_lru_simulation_equals_a_replay_through_host_tier(capacity: int) -> None:
    stream = build_stream(shared_prefixes(800))
    distances = stack_distances(stream)
    predicted = int(((distances < capacity) & stream.usable).sum())
    assert simulate(stream, "lru", capacity) == predicted
    assert replay_host_tier(stream, "lru", capacity) == predicted


@pytest.mark.parametrize("capacity", [6, 20, 70])
def test_lru_with_admission_equals_a_replay_through_host_tier(capacity: int) -> None:
    stream = build_stream(shared_prefixes(800, seed=2))
    (admitted,) = admitted_samples(samples(stream, exact_limit=10**9))
    predicted = int(((admitted.distances < capacity) & stream.usable).sum())
    assert replay_host_tier(stream, "lru", capacity, admission=True) == predicted
    assert simulate(stream, "lru", capacity, admission=True) == predicted


@pytest.mark.parametrize("admission", [False, True])
@pytest.mark.parametrize("capacity", [6, 20, 70])
def test_arc_simulation_drives_the_policy_as_host_tier_does(capacity: int, admission: bool) -> None:
    stream = build_stream(shared_prefixes(800, seed=3))
    assert simulate(stream, "arc", capacity, admission) == replay_host_tier(
        stream, "arc", capacity, admission
    )


def test_the_plan_curve_is_the_replayed_hit_ratio() -> None:
    trace = shared_prefixes(600, seed=4)
    analysis = analyze(trace, PlanOptions(bytes_per_token=64, chunk_tokens=16, device_bytes=0))
    lru = analysis.curves["lru"]
    for capacity in lru.capacities[lru.capacities >= 6][:8]:
        replayed = replay_host_tier(analysis.stream, "lru", int(capacity)) * 16
        assert lru.at(capacity) * analysis.total_tokens == pytest.approx(replayed)


def test_shards_sampling_stays_near_the_exact_curve() -> None:
    stream = build_stream(shared_prefixes(6000, seed=5, docs=400))
    total = int(stream.usable.sum())
    exact = samples(stream, exact_limit=10**9)
    sampled = samples(stream, exact_limit=len(stream) // 3)
    assert len(exact) == 1 and len(sampled) == 4
    grid = np.array([10, 50, 200, 800, 2000])
    from kvtier.plan.curves import stack_curve

    exact_curve = stack_curve("x", exact, grid, float(total * 16))
    sampled_curve = stack_curve("x", sampled, grid, float(total * 16))
    assert sampled_curve.error > 0
    assert np.abs(sampled_curve.hit - exact_curve.hit).max() <= 4 * sampled_curve.error + 0.02
