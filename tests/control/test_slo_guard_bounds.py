"""Every number of the SLO guard, on both sides and at itself, and every order of a switch by
hand, a cool-down and a trip.

``sustain_s``, ``cooldown_s`` (and its backoff, capped at ``MAX_BACKOFF``), ``window_s``,
``min_samples``, the p99, ``recover_ratio`` and failed promotions, on an injected clock: no
test here waits for time to pass.
"""

from __future__ import annotations

import pytest

from kvtier import TieringManager
from kvtier.config import MemoryTierConfig
from kvtier.control.slo_guard import MAX_BACKOFF, SLOGuard, SLOGuardConfig, Window
from kvtier.tiers.memory import MemoryTier
from tests.conftest import config

START = 1000.0
EPS = 1e-6


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def guard(**options: float) -> tuple[SLOGuard, Clock]:
    settings = {"window_s": 10.0, "sustain_s": 2.0, "cooldown_s": 5.0, "min_samples": 3}
    clock = Clock()
    return SLOGuard(SLOGuardConfig(**{**settings, **options}), clock), clock


def trip(g: SLOGuard, clock: Clock, tier: str = "fs") -> float:
    """Slow promotions from ``tier`` for sustain_s (2 s): the guard switches it off; when."""
    for _ in range(3):
        g.observe_promotion(tier, 0.5)
    assert g.decide([tier], []) == []
    clock.now += 2.0
    assert [(d.tier, d.enable) for d in g.decide([tier], [])] == [(tier, False)]
    return clock.now


def returns_at(g: SLOGuard, clock: Clock, when: float, tier: str = "fs") -> None:
    """The tier stays off until ``when`` and comes back on exactly then."""
    clock.now = when - EPS
    assert g.decide([], [tier]) == []
    clock.now = when
    assert [(d.tier, d.enable) for d in g.decide([], [tier])] == [(tier, True)]


# -- sustain_s, cooldown_s and the backoff ------------------------------------------------------
@pytest.mark.parametrize(("after", "trips"), [(2.0 - EPS, False), (2.0, True)])
def test_the_guard_trips_exactly_at_sustain_s(after, trips):
    g, clock = guard(promotion_p99_s=0.1)
    for _ in range(3):
        g.observe_promotion("fs", 0.5)
    assert g.decide(["fs"], []) == []
    clock.now += after
    assert bool(g.decide(["fs"], [])) is trips


def test_a_tier_returns_exactly_at_the_end_of_its_cool_down():
    g, clock = guard(promotion_p99_s=0.1)
    returns_at(g, clock, trip(g, clock) + 5.0)


def test_the_backoff_doubles_up_to_its_cap_and_no_further():
    """Each trip right after the return doubles the cool-down: 5, 10, 20, 40, 80 s, then 80 s
    again (MAX_BACKOFF 16), however often the tier trips."""
    g, clock = guard(promotion_p99_s=0.1)
    waits = []
    for _ in range(8):
        tripped = trip(g, clock)
        backoff = min(2 ** len(waits), MAX_BACKOFF)
        returns_at(g, clock, tripped + 5.0 * backoff)
        waits.append(clock.now - tripped)
    assert waits == [5.0, 10.0, 20.0, 40.0, 80.0, 80.0, 80.0, 80.0]


@pytest.mark.parametrize(("since_return", "cool_down"), [(10.0 - EPS, 10.0), (10.0, 5.0)])
def test_a_trip_exactly_window_s_after_the_return_starts_the_backoff_over(since_return, cool_down):
    """A trip less than window_s (10 s) after the tier's return doubles its cool-down; one
    exactly window_s after it starts over at cooldown_s."""
    g, clock = guard(promotion_p99_s=0.1)
    returns_at(g, clock, trip(g, clock) + 5.0)
    returned = clock.now
    clock.now = returned + since_return - 2.0
    tripped = trip(g, clock)
    assert tripped == returned + since_return
    returns_at(g, clock, tripped + cool_down)


# -- the window, its samples and its p99 --------------------------------------------------------
def test_a_sample_stays_in_the_window_until_window_s_have_passed():
    window = Window(10.0)
    for _ in range(3):
        window.add(100.0, 5.0)
    assert window.p99(110.0, 3) == 5.0
    assert window.p99(110.0 + EPS, 3) is None


@pytest.mark.parametrize("min_samples", [1, 3, 20])
def test_a_budget_is_judged_from_exactly_min_samples(min_samples):
    window = Window(10.0)
    for _ in range(min_samples - 1):
        window.add(100.0, 5.0)
    assert window.p99(100.0, min_samples) is None
    window.add(100.0, 5.0)
    assert window.p99(100.0, min_samples) == 5.0


@pytest.mark.parametrize(("count", "p99"), [(1, 1.0), (100, 99.0), (101, 100.0), (200, 198.0)])
def test_the_p99_of_100_samples_is_the_99th(count, p99):
    window = Window(10.0)
    for value in range(count, 0, -1):  # any order
        window.add(100.0, float(value))
    assert window.p99(100.0, 1) == p99


@pytest.mark.parametrize(("p99", "trips"), [(0.1, False), (0.1 + EPS, True)])
def test_a_budget_is_broken_only_above_it(p99, trips):
    g, clock = guard(promotion_p99_s=0.1)
    for _ in range(3):
        g.observe_promotion("fs", p99)
    g.decide(["fs"], [])
    clock.now += 2.0
    assert bool(g.decide(["fs"], [])) is trips


@pytest.mark.parametrize("seconds", [0.0, 0.001, 0.1])
def test_failed_promotions_break_the_budget_however_fast(seconds):
    g, clock = guard(promotion_p99_s=0.1)
    for _ in range(3):
        g.observe_promotion("fs", seconds, failed=True)
    g.decide(["fs"], [])
    clock.now += 2.0
    assert [d.enable for d in g.decide(["fs"], [])] == [False]


@pytest.mark.parametrize(("ttft", "back"), [(0.8, False), (0.8 - EPS, True)])
def test_a_request_budget_recovers_only_below_recover_ratio(ttft, back):
    """TTFT budget 1 s, recover_ratio 0.8: past its cool-down, the tier returns once the
    window's p99 is below 0.8 s, not at it."""
    g, clock = guard(ttft_p99_s=1.0, recover_ratio=0.8)
    for _ in range(3):
        g.observe_request(ttft_s=2.0)
    g.decide(["fs"], [])
    clock.now += 2.0
    assert [(d.tier, d.enable) for d in g.decide(["fs"], [])] == [("fs", False)]
    clock.now += 11.0  # cooled down, and the slow samples left the window
    for _ in range(3):
        g.observe_request(ttft_s=ttft)
    assert bool(g.decide([], ["fs"])) is back


# -- a switch by hand, a cool-down and a trip, in every order -----------------------------------
@pytest.mark.parametrize(
    "order",
    ["trip, hand off, cool-down", "trip, hand on, cool-down", "trip, cool-down, hand off",
     "hand off, cool-down", "trip, hand on, trip soon", "trip, hand on, trip later"],
)  # fmt: skip
def test_switch_by_hand_cool_down_and_trip_in_every_order(order):
    """The guard never switches on a tier the operator switched (on or off) after its trip,
    and a trip soon after the operator's return still doubles the next cool-down."""
    g, clock = guard(promotion_p99_s=0.1)
    steps = order.split(", ")
    tripped = trip(g, clock) if steps[0] == "trip" else None
    if "cool-down" in steps and steps.index("cool-down") < len(steps) - 1:
        assert tripped is not None
        returns_at(g, clock, tripped + 5.0)
    hand = next(s for s in steps if s.startswith("hand"))
    clock.now += 1.0
    g.switched_by_hand("fs")
    if hand == "hand off" or steps[-1] == "cool-down":
        clock.now += 1000.0  # long past the cool-down: its end no longer switches it on
        assert g.decide([], ["fs"]) == [], "the operator's tier stays as the operator left it"
        return
    clock.now += 1.0 if steps[-1] == "trip soon" else 20.0
    again = trip(g, clock)
    returns_at(g, clock, again + (10.0 if steps[-1] == "trip soon" else 5.0))


def test_a_switch_by_hand_that_changes_nothing_still_tells_the_guard(identity):
    """The guard switched the tier off; the operator switches it off too (no change): the
    operator's now, so the guard does not switch it back on after the cool-down."""
    slo = {"ttft_p99_s": 1.0, "window_s": 10.0, "sustain_s": 2.0, "cooldown_s": 5.0,
           "min_samples": 3}  # fmt: skip
    tier = lambda region, identity: MemoryTier(MemoryTierConfig(), region, identity)  # noqa: E731
    with TieringManager(config(2, slo_guard=slo), identity, tiers=[tier]) as m:
        clock = Clock()
        m.runtime.control.guard.clock = clock
        for _ in range(3):
            m.report_request(ttft_s=2.0)
        m.poll()
        clock.now += 2.0
        m.poll()
        assert m.tier_states() == ([], ["memory"])
        assert not m.disable_tier("memory"), "already off: nothing changed"
        clock.now += 1000.0
        for _ in range(3):
            m.report_request(ttft_s=0.01)
        m.poll()
        assert m.tier_states() == ([], ["memory"])
        assert [(s.enabled, s.reason) for s in m.take_tier_switches()] == [(False, "ttft_p99")]
