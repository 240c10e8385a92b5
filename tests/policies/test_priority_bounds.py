"""Every number of retention, on both sides and at itself, and every change of an expiry.

The priority range (-1, 0, 100, 101), durations (0 and just above), the request cap (one
below, at, one above), expiries just before and at their end, and an expiry renewed,
replaced and removed; through the manager and ``HostTier``. The same rules under vLLM:
``tests/integrations/vllm/test_retention_bounds.py``.
"""

from __future__ import annotations

import pytest

from kvtier import TieringManager
from kvtier.core.host_slots import HostTier
from kvtier.errors import InvalidArgumentError
from kvtier.policies.priority import DEFAULT_PRIORITY, OperatorRetention
from tests.conftest import config, make_keys, store


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def capped(m: TieringManager) -> int:
    return m.stats()["counters"].get("kvtier_retention_ignored_total{reason=capped}", 0)


@pytest.mark.parametrize("operator", [False, True])
@pytest.mark.parametrize(("priority", "valid"), [(-1, False), (0, True), (100, True), (101, False)])
def test_the_priority_range_through_the_manager(identity, priority, valid, operator):
    keys = make_keys(identity, 2)
    with TieringManager(config(4, max_request_priority=100), identity) as m:
        if not valid:
            with pytest.raises(InvalidArgumentError, match="priority"):
                m.prepare_store(keys, priority=priority, operator=operator)
            assert m.stats()["host"]["used_slots"] == 0
            return
        plan = m.prepare_store(keys, priority=priority, operator=operator)
        assert plan is not None
        m.complete_store(plan.keys)
        m.touch(keys[1:], priority=priority, operator=operator)
        assert [m.host.priority_of(key) for key in keys] == [priority, priority]


@pytest.mark.parametrize(("duration", "valid"), [(0, False), (-1.0, False), (1e-9, True)])
def test_a_duration_must_be_above_zero_through_the_manager(identity, duration, valid):
    keys = make_keys(identity, 1)
    with TieringManager(config(2), identity) as m:
        if valid:
            store(m, keys)
            m.touch(keys, priority=50, duration_s=duration)
        else:
            with pytest.raises(InvalidArgumentError, match="duration_s"):
                m.prepare_store(keys, priority=50, duration_s=duration)


@pytest.mark.parametrize(("asked", "given", "counted"), [(69, 69, 0), (70, 70, 0), (71, 70, 1)])
def test_a_request_may_ask_for_exactly_the_cap(identity, asked, given, counted):
    keys = make_keys(identity, 1)
    with TieringManager(config(2, max_request_priority=70), identity) as m:
        plan = m.prepare_store(keys, priority=asked)
        assert plan is not None
        m.complete_store(plan.keys)
        assert (m.host.priority_of(keys[0]), capped(m)) == (given, counted)


# -- expiries in host memory: renewed, replaced, removed, and their end --------------------
def two_chunks(clock: Clock) -> HostTier:
    """Host memory of two slots: ``kept`` (the least recent) and ``other``, both ready."""
    host = HostTier(2, "lru", clock=clock)
    host.allocate(["kept", "other"])
    host.complete_write(["kept", "other"], success=True)
    host.touch(["other"])
    return host


def evicted_at(host: HostTier, clock: Clock, now: float) -> str:
    clock.now = now
    _, evicted = host.allocate(["new"])
    return str(evicted[0])


@pytest.mark.parametrize(
    ("changes", "now", "evicted"),
    [([(80, 10.0)], 9.999, "other"),  # before its end
     ([(80, 10.0)], 10.0, "kept"),  # at its end
     ([(80, 10.0), (80, 20.0)], 19.999, "other"),  # renewed: the later end
     ([(80, 10.0), (80, 20.0)], 20.0, "kept"),
     ([(80, 20.0), (80, 10.0)], 10.0, "kept"),  # replaced by an earlier end
     ([(80, 10.0), (60, 20.0)], 15.0, "other"),  # another priority, its own end
     ([(80, 10.0), (80, None)], 1e9, "other"),  # removed: for good
     ([(80, 10.0), (90, None)], 1e9, "other"),
     ([(80, 10.0), (DEFAULT_PRIORITY, None)], 5.0, "other"),  # the default at once, most recent
     ([(80, 10.0), (DEFAULT_PRIORITY, None)], 11.0, "other")],  # and no end left to drop it
)  # fmt: skip
def test_an_expiry_is_renewed_replaced_and_removed(changes, now, evicted):
    clock = Clock()
    host = two_chunks(clock)
    for priority, until in changes:
        host.set_priority(["kept"], priority, until)
    assert evicted_at(host, clock, now) == evicted


@pytest.mark.parametrize(("now", "evicted"), [(9.999, "other"), (10.0, "kept")])
def test_an_expiry_given_while_the_chunk_is_written_ends_at_its_end(now, evicted):
    clock = Clock()
    host = HostTier(2, "lru", clock=clock)
    host.allocate(["kept"])
    host.set_priority(["kept"], 80, 10.0)
    host.complete_write(["kept"], success=True)
    host.allocate(["other"])
    host.complete_write(["other"], success=True)
    assert evicted_at(host, clock, now) == evicted


@pytest.mark.parametrize(("now", "holds"), [(9.999, True), (10.0, False), (10.001, False)])
def test_the_operators_retention_ends_exactly_at_its_end(now, holds):
    given: OperatorRetention[str] = OperatorRetention()
    given.give("k", 95, 10.0)
    assert given.holds("k", 95, now) is holds


def test_a_chunk_stored_anew_is_no_longer_the_operators(identity):
    """The operator retained a chunk; it left host memory and a request stores it again at
    60: the new copy is the request's (the operator's retention ended with the old one)."""
    keys, others = make_keys(identity, 1), make_keys(identity, 2, seed=5)
    with TieringManager(config(2), identity) as m:
        plan = m.prepare_store(keys, priority=95, operator=True)
        assert plan is not None
        m.complete_store(plan.keys)
        store(m, others)  # evicts it, whatever its priority: the other slot is not enough
        assert keys[0] not in m.host
        plan = m.prepare_store(keys, priority=60)
        assert plan is not None and plan.keys == keys
        m.complete_store(plan.keys)
        assert m.host.priority_of(keys[0]) == 60
