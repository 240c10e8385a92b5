"""Tiers switched off and on at run time, by hand and by the SLO guard.

A switched-off tier gets no lookups, promotions or writes; its jobs in flight finish safely;
serving continues from host memory and the other tiers, never with wrong bytes, never stuck.
"""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest
from prometheus_client import generate_latest

from kvtier import RETRY, ConfigError, KVTierError, TieringManager
from kvtier.config import FsTierConfig, MemoryTierConfig
from kvtier.control.slo_guard import SLOGuard, SLOGuardConfig
from kvtier.core.tier_set import MAX_REASON_LABELS
from kvtier.errors import ClosedError, InvalidArgumentError
from kvtier.tiers.fault import FaultInjectingTier
from kvtier.tiers.fs.tier import FilesystemTier
from kvtier.tiers.memory import MemoryTier
from tests.conftest import config, fill, make_keys, push_out, read, settle, store, wait_for


def fs_factory(root):
    return lambda region, identity: FilesystemTier(
        FsTierConfig(root_dir=str(root)), region, identity
    )


def slow_memory(region, identity):
    return FaultInjectingTier(MemoryTier(MemoryTierConfig(), region, identity), name="slow")


def counter(m, name):
    return m.stats()["counters"].get(name, 0)


def test_a_disabled_tier_is_asked_nothing_and_written_nothing(identity, tmp_path):
    keys, later = make_keys(identity, 2), make_keys(identity, 2, seed=3)
    with TieringManager(config(2), identity, tiers=[fs_factory(tmp_path)]) as m:
        store(m, keys)
        assert m.wait_idle(10)
        assert m.disable_tier("fs") and not m.disable_tier("fs")
        store(m, later)  # evicts keys from host; not written to the disabled fs tier
        assert m.wait_idle(10)
        lookups = counter(m, "kvtier_tier_lookups_total{result=hit,tier=fs}")
        assert m.lookup(keys) == 0, "no RETRY: the disabled tier is not waited on"
        assert counter(m, "kvtier_tier_lookups_total{result=hit,tier=fs}") == lookups
        assert counter(m, "kvtier_recomputed_chunks_total{reason=tier_disabled}") == 2
        assert m.stats()["disabled_tiers"] == ["fs"]
        assert m.enable_tier("fs")
        assert settle(m, keys) == 2 and read(m, keys)
        push_out(m, identity, 2)
        assert settle(m, later) == 0, "chunks stored while the tier was off never reached it"
        switches = m.take_tier_switches()
    assert [(s.tier, s.enabled, s.reason) for s in switches] == [
        ("fs", False, "manual"),
        ("fs", True, "manual"),
    ]


def test_switching_an_unknown_tier_names_the_tiers(identity, tmp_path):
    m = TieringManager(config(2), identity, tiers=[fs_factory(tmp_path)])
    with m, pytest.raises(KVTierError, match="fs"):
        m.disable_tier("nope")


@pytest.mark.parametrize(
    ("args", "match"),
    [((None,), "name"), ((5,), "name"), ((b"fs",), "name"), (("fs", None), "reason"),
     (("fs", 5), "reason"), (("fs", ""), "reason"), (("fs", "x" * 1000), "reason")],
)  # fmt: skip
def test_a_switch_with_a_bad_name_or_reason_is_refused_and_changes_nothing(
    identity, tmp_path, args, match
):
    """The reason is a label of kvtier_tier_disabled_total: one that is not a string broke
    every later scrape of /metrics."""
    with TieringManager(config(2), identity, tiers=[fs_factory(tmp_path)]) as m:
        with pytest.raises(InvalidArgumentError, match=match):
            m.disable_tier(*args)
        with pytest.raises(InvalidArgumentError, match="name"):
            m.enable_tier(["fs"])
        assert m.tier_states() == (["fs"], []) and m.take_tier_switches() == []
        assert m.disable_tier("fs", "maintenance")
        assert b'reason="maintenance"' in generate_latest(m.prometheus_registry())


def test_tiers_of_a_closed_manager_are_not_switched(identity, tmp_path):
    """Its tiers are closed: switching one on would report a tier serving that cannot."""
    m = TieringManager(config(2), identity, tiers=[fs_factory(tmp_path)])
    m.disable_tier("fs")
    m.take_tier_switches()
    m.close()
    for switch in (m.enable_tier, m.disable_tier):
        with pytest.raises(ClosedError):
            switch("fs")
    assert m.tier_states() == ([], ["fs"]) and m.take_tier_switches() == []


def test_a_closed_manager_takes_no_latency_report(identity, tmp_path):
    """A report after close would feed an SLO guard whose tiers are closed; a bad value is
    still named first (the argument error does not depend on the state)."""
    m = TieringManager(config(2), identity, tiers=[fs_factory(tmp_path)])
    m.report_request(ttft_s=0.1)
    m.close()
    with pytest.raises(ClosedError, match="report_request"):
        m.report_request(ttft_s=0.1, itl_s=0.01)
    with pytest.raises(InvalidArgumentError, match="ttft_s"):
        m.report_request(ttft_s=float("nan"))
    assert m.take_tier_switches() == []


def test_a_store_in_flight_when_the_tier_is_disabled_finishes_and_frees_its_slots(identity):
    keys = make_keys(identity, 2)
    with TieringManager(config(2), identity, tiers=[slow_memory]) as m:
        m.tiers[0].delay_s = 0.3
        store(m, keys)
        m.disable_tier("slow")
        assert m.prepare_store(make_keys(identity, 1, seed=8)) is None, "still written"
        assert m.wait_idle(10)
        assert m.stats()["host"]["held_slots"] == 0
        assert counter(m, "kvtier_tier_chunks_total{op=store,outcome=ok,tier=slow}") == 2


def test_lookups_stop_waiting_on_promotions_in_flight_from_a_tier_switched_off(identity):
    """A slow tier switched off while it promotes a prefix: the next lookup recomputes that
    prefix (tier_disabled) instead of answering RETRY until the tier reports. The promotion
    still lands safely, and its chunks then serve with their own bytes."""
    keys = make_keys(identity, 2)
    with TieringManager(config(4), identity, tiers=[slow_memory]) as m:
        store(m, keys)
        push_out(m, identity, 4)
        m.tiers[0].delay_s = 0.5
        assert m.lookup(keys) is RETRY
        m.disable_tier("slow")
        assert m.lookup(keys) == 0
        assert counter(m, "kvtier_recomputed_chunks_total{reason=tier_disabled}") == 2
        plan = m.prepare_store(keys)  # the engine recomputed them: nothing to store twice
        assert plan is not None and plan.keys == []
        assert m.wait_idle(10) and m.stats()["host"]["held_slots"] == 0
        assert m.lookup(keys) == 2 and read(m, keys)


def test_disable_and_enable_under_load_serve_no_wrong_bytes_and_never_stall(identity, tmp_path):
    """An engine thread stores, looks up and loads while another thread flips the fs tier."""
    prefixes = [make_keys(identity, 3, seed=s) for s in range(12)]
    stop, failures = threading.Event(), []
    with TieringManager(config(6), identity, tiers=[fs_factory(tmp_path)]) as m:

        def flip() -> None:
            while not stop.is_set():
                m.disable_tier("fs")
                time.sleep(0.003)
                m.enable_tier("fs")
                time.sleep(0.003)

        flipper = threading.Thread(target=flip)
        flipper.start()
        try:
            for round_ in range(6):
                for keys in prefixes:
                    n = settle(m, keys, timeout=20)
                    if n and not read(m, keys[:n]):
                        failures.append((round_, n))
                    plan = m.prepare_store(keys[n:]) if n < len(keys) else None
                    if plan is not None:  # None: every slot is held now; an engine skips it
                        for key, slot in zip(plan.keys, plan.slots):
                            fill(m.region, slot, key)
                        m.complete_store(plan.keys)
        finally:
            stop.set()
            flipper.join()
        assert m.wait_idle(10) and m.stats()["host"]["held_slots"] == 0
    assert failures == []


# -- the SLO guard, on its own clock --------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def guard(**options: float) -> tuple[SLOGuard, Clock]:
    settings = {"window_s": 10.0, "sustain_s": 2.0, "cooldown_s": 5.0, "min_samples": 3}
    clock = Clock()
    return SLOGuard(SLOGuardConfig(**{**settings, **options}), clock), clock


def test_the_guard_trips_only_after_a_sustained_breach():
    g, clock = guard(promotion_p99_s=0.1)
    for _ in range(3):
        g.observe_promotion("fs", 0.5)
    assert g.decide(["fs"], []) == []  # broken, not yet for sustain_s
    clock.now += 1.0
    assert g.decide(["fs"], []) == []
    clock.now += 1.0
    (decision,) = g.decide(["fs"], [])
    assert (decision.tier, decision.enable, decision.reason) == ("fs", False, "promotion_p99")


def test_a_breach_that_ends_before_sustain_s_does_not_trip():
    g, clock = guard(promotion_p99_s=0.1)
    for _ in range(3):
        g.observe_promotion("fs", 0.5)
    g.decide(["fs"], [])
    clock.now += 11.0  # the slow samples leave the window
    g.decide(["fs"], [])
    clock.now += 2.0
    assert g.decide(["fs"], []) == []


def test_a_request_budget_disables_the_newest_tier_and_returns_it_with_hysteresis():
    g, clock = guard(ttft_p99_s=1.0)
    for _ in range(3):
        g.observe_request(ttft_s=2.0)
    g.decide(["fs", "obj"], [])
    clock.now += 2.0
    assert [d.tier for d in g.decide(["fs", "obj"], [])] == ["obj"]
    clock.now += 6.0  # cooled down, but the TTFT p99 is still over budget: stays off
    assert g.decide(["fs"], ["obj"]) == []
    clock.now += 11.0
    for _ in range(3):
        g.observe_request(ttft_s=0.9)  # under budget, not under 0.8 of it: still off
    assert g.decide(["fs"], ["obj"]) == []
    for _ in range(300):
        g.observe_request(ttft_s=0.1)
    (back,) = g.decide(["fs"], ["obj"])
    assert (back.tier, back.enable) == ("obj", True)


def test_a_tier_that_trips_again_soon_waits_twice_as_long():
    g, clock = guard(promotion_p99_s=0.1)

    def trip(enabled: list[str]) -> None:
        for _ in range(3):
            g.observe_promotion("fs", 0.5)
        g.decide(enabled, [])
        clock.now += 2.0
        assert [d.enable for d in g.decide(enabled, [])] == [False]

    trip(["fs"])
    clock.now += 5.0
    assert [d.enable for d in g.decide([], ["fs"])] == [True]
    trip(["fs"])
    clock.now += 5.0
    assert g.decide([], ["fs"]) == [], "the second cool-down is twice as long"
    clock.now += 5.0
    assert [d.enable for d in g.decide([], ["fs"])] == [True]


def test_a_tier_back_from_its_cool_down_is_judged_on_its_promotions_since():
    """Jobs in flight when the tier tripped report their slow promotions after it: back and
    healthy, the tier is not switched off again by them."""
    g, clock = guard(promotion_p99_s=0.1)
    for _ in range(3):
        g.observe_promotion("fs", 0.5)
    g.decide(["fs"], [])
    clock.now += 2.0
    assert [d.enable for d in g.decide(["fs"], [])] == [False]
    for _ in range(3):
        g.observe_promotion("fs", 0.5)  # late reports of the jobs in flight at the trip
    clock.now += 5.0
    assert [d.enable for d in g.decide([], ["fs"])] == [True]
    for _ in range(8):
        g.observe_promotion("fs", 0.01)
        clock.now += 1.0
        assert g.decide(["fs"], []) == []


def test_a_tier_disabled_by_hand_is_never_switched_on_by_the_guard():
    g, clock = guard(promotion_p99_s=0.1)
    clock.now += 1000.0
    assert g.decide([], ["fs"]) == []


def test_a_request_budget_trips_one_tier_for_one_breach():
    """TTFT slow for 30 s, fine from the moment the newest tier is off: the samples from before
    that switch do not go on to trip the next tier (they say nothing about it)."""
    g, clock = guard(
        ttft_p99_s=1.0, window_s=60.0, sustain_s=30.0, cooldown_s=120.0, min_samples=20
    )
    enabled, switches = ["fs", "obj"], []
    for second in range(120):
        clock.now = 1000.0 + second
        g.observe_request(ttft_s=2.0 if "obj" in enabled else 0.1)
        for decision in g.decide(enabled, [t for t in ("fs", "obj") if t not in enabled]):
            switches.append((decision.tier, decision.enable))
            if not decision.enable:
                enabled.remove(decision.tier)
    assert switches == [("obj", False)]


@pytest.mark.parametrize("second", ["itl", "promotion"])
def test_two_budgets_broken_by_one_tier_switch_off_that_tier_only(second):
    """TTFT and a second budget slow while the newest tier serves, both fine once it is off:
    the second budget's samples from before that switch do not go on to trip the next tier."""
    g, clock = guard(
        ttft_p99_s=1.0,
        itl_p99_s=0.1,
        promotion_p99_s=0.1,
        window_s=60.0,
        sustain_s=30.0,
        cooldown_s=120.0,
        min_samples=20,
    )
    enabled, switches = ["fs", "obj"], []
    for tick in range(120):
        clock.now = 1000.0 + tick
        slow = "obj" in enabled
        g.observe_request(ttft_s=2.0 if slow else 0.1, itl_s=0.5 if slow and second == "itl" else 0)
        if slow and second == "promotion":
            g.observe_promotion("obj", 0.5)
        for decision in g.decide(enabled, [t for t in ("fs", "obj") if t not in enabled]):
            switches.append((decision.tier, decision.enable))
            if not decision.enable:
                enabled.remove(decision.tier)
    assert switches == [("obj", False)]


def test_a_tier_the_guard_tripped_is_in_the_operators_hands_once_switched_by_hand(identity):
    """The guard switched the tier off; the operator switched it back on, then off again: the
    guard's old cool-down does not switch it on behind the operator's back."""
    slo = {
        "ttft_p99_s": 1.0,
        "window_s": 0.05,
        "sustain_s": 0.01,
        "cooldown_s": 0.05,
        "min_samples": 1,
    }
    with TieringManager(config(2, slo_guard=slo), identity, tiers=[slow_memory]) as m:

        def tripped() -> bool:  # a fresh slow sample each time: never out of the window
            m.report_request(ttft_s=5.0)
            m.poll()
            return m.tier_states()[1] == ["slow"]

        wait_for(tripped, what="tripped")
        assert m.enable_tier("slow") and m.disable_tier("slow")
        time.sleep(0.1)  # past the cool-down, and the slow samples have left the window
        m.poll()
        assert m.tier_states() == ([], ["slow"])
        reasons = [(s.enabled, s.reason) for s in m.take_tier_switches()]
    assert reasons == [(False, "ttft_p99"), (True, "manual"), (False, "manual")]


@pytest.mark.parametrize(
    ("bad", "message"),
    [({"ttft_p99_s": 1.0, "cooldown_s": 1e18}, r"^slo_guard\.cooldown_s: .*86400"),
     ({"ttft_p99_s": 1.0, "window_s": 1e9}, r"^slo_guard\.window_s: "),
     ({"ttft_p99_s": 1e9}, r"^slo_guard\.ttft_p99_s: "),
     ({"ttft_p99_s": 1.0, "sustain_s": 0}, r"^slo_guard\.sustain_s: "),
     ({"ttft_p99_s": 1.0, "recover_ratio": 0}, r"^slo_guard\.recover_ratio: "),
     ({"ttft_p99_s": 1.0, "min_samples": 5000}, r"^slo_guard\.min_samples: "),
     ({}, r"^slo_guard\.promotion_p99_s, ttft_p99_s, itl_p99_s: ")],
)  # fmt: skip
def test_guard_settings_in_a_config_are_bounded_and_named_once(bad, message):
    with pytest.raises(ConfigError, match=message):
        config(2, slo_guard=bad)


@pytest.mark.parametrize(
    "bad",
    [{}, {"ttft_p99_s": float("nan")}, {"ttft_p99_s": 1.0, "min_samples": 0},
     {"ttft_p99_s": 1.0, "recover_ratio": 1.5}, {"ttft_p99_s": 1.0, "window_s": float("inf")}],
)  # fmt: skip
def test_guard_settings_are_checked(bad):
    with pytest.raises(KVTierError):
        SLOGuardConfig(**bad)


# -- the SLO guard in a manager -------------------------------------------------------------------
def test_a_tier_turning_slow_is_switched_off_then_back_on_when_healthy(identity):
    """Promotions from a tier that turns slow mid-run trip the guard: lookups stop waiting on
    it. Once it is fast again it returns after its cool-down and serves promotions."""
    slo = {
        "promotion_p99_s": 0.1,
        "window_s": 1.0,
        "sustain_s": 0.2,
        "cooldown_s": 0.5,
        "min_samples": 2,
    }
    with TieringManager(config(4, slo_guard=slo), identity, tiers=[slow_memory]) as m:
        slow = m.tiers[0]
        prefixes = [make_keys(identity, 1, seed=s) for s in range(40)]
        for keys in prefixes:
            store(m, keys)
            assert m.wait_idle(10)
        slow.delay_s = 0.3
        tried, seeds = iter(prefixes), itertools.count(900)

        def promote_once() -> bool:
            keys = next(tried)
            push_out(m, identity, 4, seed=next(seeds))
            return settle(m, keys, timeout=20) == 0 and "slow" in m.stats()["disabled_tiers"]

        wait_for(promote_once, timeout=30)
        assert m.lookup(make_keys(identity, 1, seed=39)) is not RETRY
        slow.delay_s = 0.0
        wait_for(lambda: (m.poll(), not m.stats()["disabled_tiers"])[1], timeout=30)
        assert counter(m, "kvtier_tier_disabled_total{reason=promotion_p99,tier=slow}") >= 1
        reasons = [(s.enabled, s.reason) for s in m.take_tier_switches()]
    assert (False, "promotion_p99") in reasons and (True, "cooled_down") in reasons


@pytest.mark.parametrize("value", ["5", True, float("nan"), float("inf"), -0.1, [1.0], b"1"])
def test_request_latencies_that_are_not_seconds_are_refused(identity, value):
    slo = {"ttft_p99_s": 1.0, "min_samples": 1}
    with TieringManager(config(2, slo_guard=slo), identity, tiers=[slow_memory]) as m:
        for name in ("ttft_s", "itl_s"):
            with pytest.raises(InvalidArgumentError, match=name):
                m.report_request(**{name: value})
        m.report_request(ttft_s=0.5, itl_s=None)  # numbers of any kind are fine
        m.report_request(ttft_s=np.float32(0.5), itl_s=1)


def test_reasons_past_the_limit_share_one_label_and_keep_their_record(identity, tmp_path):
    """Each reason given over the admin endpoint was a new series of kvtier_tier_disabled_total
    for as long as the process ran; past MAX_REASON_LABELS distinct ones they count as other."""
    reasons = [f"ticket-{i}" for i in range(MAX_REASON_LABELS + 3)]
    with TieringManager(config(2), identity, tiers=[fs_factory(tmp_path)]) as m:
        for reason in [*reasons, reasons[0]]:  # a reason seen before keeps its label
            assert m.disable_tier("fs", reason) and m.enable_tier("fs")
        switches = m.take_tier_switches()
        for reason in reasons[:MAX_REASON_LABELS]:
            assert counter(m, f"kvtier_tier_disabled_total{{reason={reason},tier=fs}}") == (
                2 if reason == reasons[0] else 1
            )
        assert counter(m, "kvtier_tier_disabled_total{reason=other,tier=fs}") == 3
        assert m.disable_tier("fs", "admin")  # kvtier's own reasons keep theirs, whenever
        assert counter(m, "kvtier_tier_disabled_total{reason=admin,tier=fs}") == 1
        assert not any(reason in key for key in m.stats()["counters"] for reason in reasons[-3:])
    assert [s.reason for s in switches if not s.enabled] == [*reasons, reasons[0]]
