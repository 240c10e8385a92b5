"""Retention an operator controls, through the manager (``TieringManager``, ``HostRetention``):
numbers of any size refused as ``InvalidArgumentError``, a request's priority and duration cut to
``max_request_priority`` / ``max_request_duration_s`` and counted, and the operator's retention,
which no request changes (issue 25, finding 6)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest

from kvtier import TieringManager
from kvtier.config import RuntimeConfig
from kvtier.control.retention import HostRetention
from kvtier.core.host_slots import HostTier
from kvtier.core.provenance import Provenance
from kvtier.core.runtime import Runtime
from kvtier.errors import ConfigError, InvalidArgumentError
from kvtier.keys import ChunkKey
from kvtier.policies.priority import DEFAULT_PRIORITY
from tests.conftest import config, fill, make_keys, store

HUGE, ENORMOUS = 10**400, 10**5000  # past the floats; past Python's int-to-text limit


def shown(value: Any, limit: int = 24) -> str:
    """A test id for ``value`` (``repr`` fails past 4,300 digits)."""
    if isinstance(value, dict):
        return ",".join(f"{k}={shown(v)}" for k, v in value.items())
    try:
        return repr(value)[:limit]
    except ValueError:
        return "enormous"


def ignored(m: TieringManager | Runtime, reason: str) -> float:
    return m.metrics.telemetry.get("kvtier_retention_ignored_total", reason=reason)


def priorities(m: TieringManager, keys: list[ChunkKey]) -> list[int | None]:
    return [m.host.priority_of(key) for key in keys]


# -- numbers of any size ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [{"priority": 50, "duration_s": d}
     for d in (HUGE, -HUGE, ENORMOUS, Fraction(HUGE), 1e-400, math.inf, -math.inf, math.nan)]
    + [{"priority": p} for p in (HUGE, -ENORMOUS, [ENORMOUS, 1], 101, -1)],
    ids=shown,
)  # fmt: skip
@pytest.mark.parametrize("operator", [False, True])
def test_numbers_of_any_size_are_an_invalid_argument_and_change_nothing(identity, kwargs, operator):
    """A 400-digit ``duration_s`` raised ``OverflowError`` out of ``prepare_store``/``touch``."""
    keys = make_keys(identity, 2)
    with TieringManager(config(4), identity) as m:
        store(m, keys[:1])
        by = {"operator": True} if operator else {}
        for call in (m.prepare_store, m.touch):
            with pytest.raises(InvalidArgumentError):
                call(keys, **by, **kwargs)
        assert m.stats()["host"]["used_slots"] == 1
        assert priorities(m, keys[:1]) == [DEFAULT_PRIORITY]


@pytest.mark.parametrize("first_chunk", [-ENORMOUS, -HUGE, -1], ids=shown)
def test_a_huge_negative_first_chunk_is_an_invalid_argument(identity, first_chunk):
    with TieringManager(config(2), identity) as m, pytest.raises(InvalidArgumentError):
        m.prepare_store(make_keys(identity, 1), first_chunk=first_chunk)


def test_a_huge_finite_duration_is_a_duration():
    runtime, _, retention = over(2, Clock())
    asked = retention.asked(keys_of("a"), 50, 10**300, False, runtime)
    assert asked.until == 1e300


# -- the operator's caps, through the manager -------------------------------------------------
@pytest.mark.parametrize(
    ("cap", "asked", "given"),
    [(80, 0, 0), (80, 79, 79), (80, 80, 80), (80, 81, 80), (80, 100, 80), (None, 90, 90),
     (None, 91, 90), (None, 100, 90), (100, 100, 100), (0, 35, 0)],
)  # fmt: skip
def test_a_requests_priority_is_cut_to_the_cap_and_counted(identity, cap, asked, given):
    """``max_request_priority`` (default 90) for ``prepare_store`` and ``touch`` alike."""
    keys = make_keys(identity, 2)
    extra = {} if cap is None else {"max_request_priority": cap}
    with TieringManager(config(4, **extra), identity) as m:
        plan = m.prepare_store(keys[:1], priority=asked)
        assert plan is not None
        m.complete_store(plan.keys)
        store(m, keys[1:])
        m.touch(keys[1:], priority=asked, hit=False)
        assert priorities(m, keys) == [given, given]
        assert ignored(m, "capped") == (2 if given != asked else 0)


@pytest.mark.parametrize("cap", [-1, 101, 80.0, True, HUGE], ids=shown)
def test_a_cap_out_of_range_is_refused_naming_the_key(cap):
    with pytest.raises(ConfigError, match="max_request_priority"):
        config(4, max_request_priority=cap)


@pytest.mark.parametrize("cap", [0, -1, math.inf, math.nan, HUGE, "600", True], ids=shown)
def test_a_duration_cap_out_of_range_is_refused_naming_the_key(cap):
    with pytest.raises(ConfigError, match="max_request_duration_s"):
        config(4, max_request_duration_s=cap)


def test_the_operators_retention_is_not_capped(identity):
    keys = make_keys(identity, 2)
    with TieringManager(config(4, max_request_priority=80), identity) as m:
        plan = m.prepare_store(keys[:1], priority=100, operator=True)
        assert plan is not None
        m.complete_store(plan.keys)
        store(m, keys[1:])
        m.touch(keys[1:], priority=95, hit=False, operator=True)
        assert priorities(m, keys) == [100, 95] and ignored(m, "capped") == 0


def test_a_priority_given_back_at_the_default_for_good_is_the_default(identity):
    """``touch(priority=35)`` used to be skipped as "all default", leaving the 90 in place."""
    keys = make_keys(identity, 1)
    with TieringManager(config(2), identity) as m:
        store(m, keys)
        m.touch(keys, priority=90, hit=False)
        m.touch(keys, priority=DEFAULT_PRIORITY, hit=False)
        assert priorities(m, keys) == [DEFAULT_PRIORITY]


# -- the test: one client asking for 100 forever ---------------------------------------
@pytest.mark.parametrize("operator", [True, False])
def test_one_client_asking_for_100_forever_cannot_evict_the_operators_prefix(identity, operator):
    """Host memory of 8 chunks; a 2-chunk system prompt the operator retains at 95 (requests
    capped at 80); one client stores 6 new chunks a round at priority 100 for good and asks
    for the prompt at 0. With the operator's retention the prompt stays all 50 rounds; given
    as a request's (cut to 80, then lowered) it is gone at once."""
    prompt = make_keys(identity, 2)
    with TieringManager(config(8, max_request_priority=80), identity) as m:
        store(m, prompt)
        m.touch(prompt, priority=95, hit=False, operator=operator)
        kept = 0
        for round_ in range(50):
            plan = m.prepare_store(make_keys(identity, 6, seed=100 + round_), priority=100)
            assert plan is not None
            for key, slot in zip(plan.keys, plan.slots, strict=True):
                fill(m.region, slot, key)
            m.complete_store(plan.keys)
            m.touch(prompt, priority=0, hit=False)
            kept += all(m.host.is_ready(key) for key in prompt)
        if operator:
            assert kept == 50 and priorities(m, prompt) == [95, 95]
            assert ignored(m, "capped") == 50
        else:
            assert kept == 1, "kept while there was room: the first round"


def test_the_operators_retention_is_lifted_without_a_priority(identity):
    keys = make_keys(identity, 1)
    with TieringManager(config(2), identity) as m:
        store(m, keys)
        m.touch(keys, priority=95, hit=False, operator=True)
        m.touch(keys, priority=10, hit=False)
        assert priorities(m, keys) == [95]
        m.touch(keys, hit=False, operator=True)  # lifted: the chunk keeps 95 until told
        assert priorities(m, keys) == [95]
        m.touch(keys, priority=10, hit=False)
        assert priorities(m, keys) == [10]


# -- durations, with an injected clock (HostRetention over a real HostTier) --------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def over(slots: int, clock: Clock, **settings: Any) -> tuple[Runtime, HostTier, HostRetention]:
    runtime = Runtime(RuntimeConfig(**settings), 4096)
    host = HostTier(slots, "lru", clock=clock)
    provenance = Provenance(runtime.metrics, runtime.tiers, 16)
    return runtime, host, HostRetention(host, runtime.admission, provenance, clock)


def keys_of(*names: str) -> list[ChunkKey]:
    return [ChunkKey(name.encode().ljust(32, b"-")) for name in names]


def put(parts: tuple[Runtime, HostTier, HostRetention], keys: list[ChunkKey], **asks: Any) -> list:
    """Store ``keys`` as the manager does; the keys evicted for them."""
    runtime, host, retention = parts
    asked = retention.asked(keys, asks.get("priority"), asks.get("duration_s"),
                            asks.get("operator", False), runtime)  # fmt: skip
    new = retention.plan_store(keys, len(keys), asked.priorities)
    allocated = host.allocate(new)
    assert allocated is not None
    retention.reserved(new, asked.priorities, asked)
    host.complete_write(new, success=True)
    return allocated[1]


@pytest.mark.parametrize(
    ("asked", "until", "capped"),
    [(None, 600.0, 1), (599.5, 599.5, 0), (600, 600.0, 0), (600.001, 600.0, 1), (1e300, 600.0, 1)],
)
def test_a_requests_duration_is_cut_to_the_cap_and_counted(asked, until, capped):
    clock = Clock()
    clock.now = 1000.0
    runtime, _, retention = over(2, clock, max_request_duration_s=600)
    got = retention.asked(keys_of("a"), 80, asked, False, runtime)
    assert got.until == 1000.0 + until and ignored(runtime, "capped") == capped
    operator = retention.asked(keys_of("a"), 80, asked, True, runtime)
    assert operator.until == (None if asked is None else 1000.0 + asked)


@pytest.mark.parametrize(("now", "evicted"), [(599.999, "other"), (600.0, "held")])
def test_a_capped_duration_ends_at_the_cap_and_not_before(now, evicted):
    """Asked for 90 for good with ``max_request_duration_s: 600``: 90 until 600 s, then 35."""
    clock = Clock()
    parts = over(2, clock, max_request_duration_s=600)
    held, other, new = keys_of("held", "other", "new")
    put(parts, [held], priority=90)
    put(parts, [other])
    clock.now = now
    assert put(parts, [new]) == [{"held": held, "other": other}[evicted]]


@pytest.mark.parametrize(("now", "priority"), [(9.999, 95), (10.0, 0)])
def test_the_operators_retention_for_a_duration_yields_to_requests_once_over(now, priority):
    clock = Clock()
    runtime, host, retention = parts = over(2, clock)
    key = keys_of("sys")
    put(parts, key, priority=95, duration_s=10, operator=True)
    clock.now = now
    retention.retain_each(key, [0], retention.asked(key, 0, None, False, runtime))
    assert host.priority_of(key[0]) == priority


def test_the_operators_retention_ends_with_the_chunk():
    """Evicted and stored anew, a chunk is a request's again (its old retention is over)."""
    clock = Clock()
    runtime, host, retention = parts = over(1, clock)
    sys_key, other = keys_of("sys", "other")
    put(parts, [sys_key], priority=20, operator=True)
    put(parts, [other])  # evicts sys (the only slot)
    put(parts, [sys_key], priority=60)
    assert host.priority_of(sys_key) == 60
    retention.retain_each([sys_key], [70], retention.asked([sys_key], 70, None, False, runtime))
    assert host.priority_of(sys_key) == 70


def test_what_the_operator_retains_is_bounded_by_host_memory():
    clock = Clock()
    _, host, retention = parts = over(2, clock)
    for name in "abcdefgh":
        key = keys_of(name)
        put(parts, key, priority=95, operator=True)
    assert len(retention._operator) <= 2 * host.num_slots
