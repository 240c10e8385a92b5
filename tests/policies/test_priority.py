"""Priority retention: lower priority evicted first, then recency; durations that expire.

The semantics are TensorRT-LLM's retention config. Checked on the policy against a reference
model, on the host tier with a fake clock, and through the manager's API.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier import KVTierError, TieringManager
from kvtier.core.host_slots import HostTier
from kvtier.errors import InvalidArgumentError
from kvtier.policies import make_policy
from kvtier.policies.priority import DEFAULT_PRIORITY, PrioritizedPolicy
from tests.conftest import config, make_keys, store

KEYS = st.integers(0, 11)
LEVELS = st.sampled_from([0, 10, DEFAULT_PRIORITY, 80, 100])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), KEYS, LEVELS),
        st.tuples(st.just("touch"), KEYS),
        st.tuples(st.just("set"), KEYS, LEVELS),
        st.tuples(st.just("remove"), KEYS),
        st.tuples(st.just("evict"), st.integers(0, 4), st.frozensets(KEYS, max_size=3)),
    ),
    max_size=60,
)


class ReferenceRetention:
    """Keys ordered by (priority, last use): what a prioritized LRU must evict."""

    def __init__(self) -> None:
        self.priority: dict[int, int] = {}
        self.used: dict[int, int] = {}
        self.clock = 0

    def _use(self, key: int) -> None:
        self.clock += 1
        self.used[key] = self.clock

    def apply(self, op: tuple) -> list[int] | None:
        kind, key = op[0], op[1]
        if kind == "add" and key not in self.priority:
            self.priority[key] = op[2]
            self._use(key)
        elif kind == "touch" and key in self.priority:
            self._use(key)
        elif kind == "set" and key in self.priority and self.priority[key] != op[2]:
            self.priority[key] = op[2]
            self._use(key)
        elif kind == "remove" and key in self.priority:
            del self.priority[key], self.used[key]
        elif kind == "evict":
            return self.evict(op[1], op[2])
        return None

    def evict(self, n: int, protected: frozenset[int]) -> list[int] | None:
        order = sorted(
            (k for k in self.priority if k not in protected),
            key=lambda k: (self.priority[k], self.used[k]),
        )
        if len(order) < n:
            return None
        for key in order[:n]:
            del self.priority[key], self.used[key]
        return order[:n]


@given(OPS)
def test_prioritized_lru_matches_the_reference_model(ops):
    policy = PrioritizedPolicy[int](lambda: make_policy("lru", 8))
    model = ReferenceRetention()
    for op in ops:
        expected = model.apply(op)
        kind, key = op[0], op[1]
        if kind == "add" and key not in policy:
            policy.add(key, op[2])
        elif kind == "touch":
            policy.touch(key) if key in policy else None
        elif kind == "set":
            policy.set_priority(key, op[2])
        elif kind == "remove":
            policy.remove(key)
        elif kind == "evict":
            got = policy.evict(op[1], op[2])
            assert (None if got is None else sorted(got)) == (
                None if expected is None else sorted(expected)
            )
        assert sorted(policy) == sorted(model.priority)


@given(OPS)
def test_prioritized_arc_never_evicts_a_key_while_a_lower_priority_one_is_evictable(ops):
    policy = PrioritizedPolicy[int](lambda: make_policy("arc", 8))
    priority: dict[int, int] = {}
    for op in ops:
        kind, key = op[0], op[1]
        if kind == "add" and key not in policy:
            policy.add(key, op[2])
            priority[key] = op[2]
        elif kind == "set" and key in policy:
            policy.set_priority(key, op[2])
            priority[key] = op[2]
        elif kind == "remove":
            policy.remove(key)
            priority.pop(key, None)
        elif kind == "evict":
            left = [k for k in priority if k not in op[2]]
            got = policy.evict(op[1], op[2])
            if got is None:
                assert len(left) < op[1]
                continue
            kept = [priority[k] for k in left if k not in got]
            assert not (got and kept) or max(priority[k] for k in got) <= min(kept)
            for k in got:
                del priority[k]
        assert sorted(policy) == sorted(priority)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_the_host_tier_evicts_lower_priority_first_then_the_least_recent(policy):
    host = HostTier(3, policy)
    host.allocate(["high", "default", "low"])
    host.complete_write(["high", "default", "low"], success=True)
    host.set_priority(["high"], 80, None)
    host.set_priority(["low"], 10, None)
    _, evicted = host.allocate(["a"])
    assert evicted == ["low"]
    _, evicted = host.allocate(["b"])
    assert evicted == ["default"]


def test_an_expired_duration_drops_a_chunk_back_to_the_default_priority():
    clock = Clock()
    host = HostTier(2, "lru", clock=clock)
    host.allocate(["old"])
    host.complete_write(["old"], success=True)
    host.allocate(["pinned"])
    host.set_priority(["pinned"], 90, until=10.0)  # given while still being written
    host.complete_write(["pinned"], success=True)
    assert host.priority_of("pinned") == 90
    host.touch(["old"])  # "pinned" is now the least recent
    _, evicted = host.allocate(["x"])
    assert evicted == ["old"], "high priority outlives recency"
    clock.now = 11.0
    host.touch(["x"])
    host.complete_write(["x"], success=True)
    _, evicted = host.allocate(["y"])
    assert evicted == ["pinned"] and host.priority_of("x") == DEFAULT_PRIORITY


def test_priorities_through_the_manager(identity):
    """Priorities 80, 35, 5, then the 80 is lowered to 10: evictions go 5, then 10, then 35."""
    keys = make_keys(identity, 5)
    with TieringManager(config(3), identity) as m:
        plan = m.prepare_store(keys[:3], priority=[80, 35, 5])
        m.complete_store(plan.keys)
        m.touch(keys[:1], priority=10)
        store(m, keys[3:4])
        store(m, keys[4:5])
        evicted = [e.key for e in m.take_events() if e.kind.value == "evicted"]
    assert evicted == [keys[2], keys[0]]


def test_touch_changes_the_priority_of_chunks_in_host(identity):
    keys = make_keys(identity, 3)
    with TieringManager(config(2), identity) as m:
        store(m, keys[:2])
        m.touch(keys[:1], priority=90, hit=False)
        store(m, keys[2:])  # keys[0] is the least recent, but retained above keys[1]
        events = [(e.kind.value, e.key) for e in m.take_events()]
    assert ("evicted", keys[1]) in events and ("evicted", keys[0]) not in events


@pytest.mark.parametrize(
    "kwargs",
    [{"priority": 101}, {"priority": -1}, {"priority": True}, {"priority": [1]},
     {"priority": 50, "duration_s": float("nan")}, {"priority": 50, "duration_s": 0}],
)  # fmt: skip
def test_bad_priorities_are_refused_at_the_call(identity, kwargs):
    keys = make_keys(identity, 2)
    with TieringManager(config(2), identity) as m:
        with pytest.raises(InvalidArgumentError):
            m.prepare_store(keys, **kwargs)
        with pytest.raises(KVTierError):
            m.touch(keys, **kwargs)
        assert m.stats()["host"]["used_slots"] == 0


@pytest.mark.parametrize(
    "kwargs",
    [{"priority": 50.0}, {"priority": "80"}, {"priority": {1, 2}}, {"priority": [50, None]},
     {"priority": 50, "duration_s": "5"}, {"first_chunk": -1}, {"first_chunk": "x"},
     {"first_chunk": 1.5}, {"first_chunk": True}, {"first_chunk": None}],
)  # fmt: skip
def test_arguments_of_the_wrong_type_are_refused_before_anything_changes(identity, kwargs):
    """With admission on, a bad argument is an InvalidArgumentError at the call, and no chunk
    was counted as seen: offering the chunks again is still their first sighting."""
    keys = make_keys(identity, 2)
    with TieringManager(config(2, store_threshold=2), identity) as m:
        with pytest.raises(InvalidArgumentError):
            m.prepare_store(keys, **kwargs)
        assert m.prepare_store(keys).keys == [], "seen once, not twice"


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _retained(clock: _Clock):
    from kvtier.policies import make_policy
    from kvtier.policies.priority import RetainedPolicy

    policy = RetainedPolicy(lambda: make_policy("lru", 8), clock)
    for key in ("a", "b"):
        policy.add(key)
    return policy


@pytest.mark.parametrize("again", [90, 80])
def test_a_priority_given_again_without_a_duration_has_no_end_left(again):
    """Host memory's and vLLM's retention are one RetainedPolicy: a new priority without a
    duration replaces the old end (one kept by mistake would drop it back at the old time)."""
    clock = _Clock()
    policy = _retained(clock)
    policy.retain("a", 80, until=10.0)
    policy.retain("a", again, until=None)
    clock.now = 11.0
    assert policy.evict(1, set()) == ["b"] and policy.priority_of("a") == again


@pytest.mark.parametrize("given", ["add", "retain"])
@pytest.mark.parametrize(("now", "priority"), [(9.999, 80), (10.0, 35)])
def test_a_priority_ends_at_its_end_and_not_before(now, priority, given):
    clock = _Clock()
    policy = _retained(clock)
    if given == "add":
        policy.add("c", 80, until=10.0)
    else:
        policy.add("c")
        policy.retain("c", 80, until=10.0)
    clock.now = now
    assert policy.evict(1, {"c"}) == ["a"]
    assert "c" in policy and policy.priority_of("c") == priority
