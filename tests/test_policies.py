"""LRU and ARC against small reference models; ARC's scan resistance."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.policies import make_policy
from kvtier.policies.arc import ARCPolicy
from kvtier.policies.lru import LRUPolicy

CAPACITY = 6
KEYS = st.integers(0, 15)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), KEYS),
        st.tuples(st.just("touch"), KEYS),
        st.tuples(st.just("remove"), KEYS),
        st.tuples(st.just("evict"), st.integers(0, 4), st.frozensets(KEYS, max_size=4)),
    ),
    max_size=60,
)


class ReferenceLRU:
    def __init__(self) -> None:
        self.order: list[int] = []

    def add(self, k):
        self.order.append(k)

    def touch(self, k):
        if k in self.order:
            self.order.remove(k)
            self.order.append(k)

    def remove(self, k):
        if k in self.order:
            self.order.remove(k)

    def evict(self, n, protected):
        victims = [k for k in self.order if k not in protected][:n]
        if len(victims) < n:
            return None
        self.order = [k for k in self.order if k not in victims]
        return victims

    def resident(self):
        return set(self.order)


class ReferenceARC:
    """ARC written out with plain lists, one decision at a time."""

    def __init__(self, c: int) -> None:
        self.c, self.p = c, 0.0
        self.t1: list[int] = []
        self.t2: list[int] = []
        self.b1: list[int] = []
        self.b2: list[int] = []

    def add(self, k):
        if k in self.b1:
            self.p = min(self.c, self.p + max(1.0, len(self.b2) / len(self.b1)))
            self.b1.remove(k)
            self.t2.append(k)
        elif k in self.b2:
            self.p = max(0.0, self.p - max(1.0, len(self.b1) / len(self.b2)))
            self.b2.remove(k)
            self.t2.append(k)
        else:
            self.t1.append(k)
        self.trim()

    def touch(self, k):
        if k in self.t1:
            self.t1.remove(k)
            self.t2.append(k)
        elif k in self.t2:
            self.t2.remove(k)
            self.t2.append(k)

    def remove(self, k):
        for lst in (self.t1, self.t2):
            if k in lst:
                lst.remove(k)

    def evict(self, n, protected):
        t1 = [k for k in self.t1 if k not in protected]
        t2 = [k for k in self.t2 if k not in protected]
        victims, size_t1 = [], len(self.t1)
        for _ in range(n):
            prefer_t1 = size_t1 > self.p
            if not t1 and not t2:
                return None
            from_t1 = bool(t1) if prefer_t1 else not t2
            key = (t1 if from_t1 else t2).pop(0)
            size_t1 -= from_t1
            victims.append((key, from_t1))
        for key, from_t1 in victims:
            (self.t1 if from_t1 else self.t2).remove(key)
            (self.b1 if from_t1 else self.b2).append(key)
        self.trim()
        return [k for k, _ in victims]

    def trim(self):
        while self.b1 and len(self.t1) + len(self.b1) > self.c:
            self.b1.pop(0)
        while (self.b1 or self.b2) and sum(
            map(len, (self.t1, self.t2, self.b1, self.b2))
        ) > 2 * self.c:
            (self.b2 or self.b1).pop(0)

    def resident(self):
        return set(self.t1) | set(self.t2)


def run(ops, policy, reference):
    resident: set[int] = set()
    for op in ops:
        if op[0] == "add":
            if op[1] in resident:
                continue
            policy.add(op[1])
            reference.add(op[1])
            resident.add(op[1])
        elif op[0] == "evict":
            got, want = policy.evict(op[1], op[2]), reference.evict(op[1], op[2])
            assert got == want
            if got is not None:
                assert len(got) == op[1] and not set(got) & op[2]
                resident -= set(got)
        else:
            getattr(policy, op[0])(op[1])
            getattr(reference, op[0])(op[1])
            if op[0] == "remove":
                resident.discard(op[1])
        assert {k for k in range(16) if k in policy} == reference.resident() == resident
        assert len(policy) == len(resident)


@given(OPS)
def test_lru_matches_reference(ops):
    run(ops, LRUPolicy(), ReferenceLRU())


@given(OPS)
def test_arc_matches_reference(ops):
    policy = ARCPolicy(CAPACITY)
    run(ops, policy, ReferenceARC(CAPACITY))
    assert len(policy.b1) + len(policy.b2) + len(policy) <= 2 * CAPACITY or len(policy) > CAPACITY


@pytest.mark.parametrize("name", ["lru", "arc"])
def test_evict_is_all_or_nothing(name):
    """Three keys, two protected: asking for two victims changes nothing."""
    policy = make_policy(name, 3)
    for key in (1, 2, 3):
        policy.add(key)
    assert policy.evict(2, {1, 2}) is None
    assert all(k in policy for k in (1, 2, 3))
    assert policy.evict(1, {1, 2}) == [3]


def scan_survivors(name: str) -> set[int]:
    """A hot set of 4 keys is reused, then a one-time scan of 40 keys passes through 8 slots."""
    policy = make_policy(name, 8)
    resident: set[int] = set()

    def access(key: int) -> None:
        if key in resident:
            policy.touch(key)
            return
        if len(resident) == 8:
            resident.difference_update(policy.evict(1, set()) or [])
        policy.add(key)
        resident.add(key)

    for _ in range(3):
        for key in range(4):
            access(key)
    for key in range(100, 140):
        access(key)
    return resident & set(range(4))


def test_arc_keeps_a_reused_set_through_a_scan_that_flushes_lru():
    assert scan_survivors("lru") == set()
    assert scan_survivors("arc") == set(range(4))
