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
        st.tuples(st.just("refresh"), KEYS),
        st.tuples(st.just("remove"), KEYS),
        st.tuples(st.just("evict"), st.integers(0, 4), st.frozensets(KEYS, max_size=4)),
    ),
    max_size=60,
)
#: A cache's life as ``HostTier`` drives it: mostly (re)admissions and hits over few keys, so
#: evicted keys come back while still ghosts (about half the examples hit B1, one in eight B2).
FEW_KEYS = st.integers(0, 11)
ACCESSES = st.lists(
    st.one_of(
        st.tuples(st.just("add"), FEW_KEYS),
        st.tuples(st.just("add"), FEW_KEYS),
        st.tuples(st.just("touch"), FEW_KEYS),
        st.tuples(st.just("refresh"), FEW_KEYS),
        st.tuples(st.just("evict"), st.integers(0, 2), st.frozensets(FEW_KEYS, max_size=2)),
    ),
    min_size=10,
    max_size=80,
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

    refresh = touch

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

    def refresh(self, k):
        for lst in (self.t1, self.t2):
            if k in lst:
                lst.remove(k)
                lst.append(k)

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


def run(ops, policy, reference, capacity=None):
    """Apply ``ops`` to both; with ``capacity``, an add into a full cache evicts one key first,
    as ``HostTier.allocate`` does, so the resident set never outgrows the cache."""
    resident: set[int] = set()
    for op in ops:
        if op[0] == "add":
            if op[1] in resident:
                continue
            if capacity is not None and len(resident) >= capacity:
                got, want = policy.evict(1, frozenset()), reference.evict(1, frozenset())
                assert got == want and got is not None
                resident -= set(got)
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
        if isinstance(reference, ReferenceARC):
            assert policy.p == reference.p
            ours = [list(x) for x in (policy.t1, policy.t2, policy.b1, policy.b2)]
            assert ours == [reference.t1, reference.t2, reference.b1, reference.b2]


@given(OPS)
def test_lru_matches_reference(ops):
    run(ops, LRUPolicy(), ReferenceLRU())


@given(ACCESSES)
def test_arc_matches_reference(ops):
    """Like ``HostTier``, every add into a full cache evicts first: T1 never outgrows the cache,
    so ghosts survive and ghost hits (which move ``p``) are common."""
    policy = ARCPolicy(CAPACITY)
    run(ops, policy, ReferenceARC(CAPACITY), capacity=CAPACITY)
    assert len(policy) <= CAPACITY
    assert len(policy.t1) + len(policy.b1) <= CAPACITY
    assert len(policy.b1) + len(policy.b2) + len(policy) <= 2 * CAPACITY


@given(OPS)
def test_arc_matches_reference_when_the_cache_overfills(ops):
    """Adds without evictions (T1 may outgrow the capacity): still the reference's decisions."""
    run(ops, ARCPolicy(CAPACITY), ReferenceARC(CAPACITY))


def filled_arc(capacity: int, once: list[int], twice: list[int]) -> ARCPolicy[int]:
    """An ARC holding ``once`` in T1 and ``twice`` in T2 (in that order)."""
    policy: ARCPolicy[int] = ARCPolicy(capacity)
    for key in [*twice, *once]:
        policy.add(key)
    for key in twice:
        policy.touch(key)
    return policy


def test_a_ghost_hit_in_b1_grows_p_so_t1_keeps_more():
    """Key 1 is evicted from T1 (into B1) and asked for again: T1 was too small, so ``p``, the
    target size of T1, grows, and later victims come from T2 while T1 is within it."""
    policy = filled_arc(4, once=[1, 2, 3], twice=[10])
    assert policy.p == 0 and policy.evict(1, set()) == [1] and list(policy.b1) == [1]
    policy.add(1)  # the B1 ghost hit
    assert policy.p == 1
    assert list(policy.t1) == [2, 3] and list(policy.t2) == [10, 1] and list(policy.b1) == []
    assert policy.evict(1, set()) == [2], "T1 holds 2 keys, above its target p = 1"
    assert policy.evict(1, set()) == [10], "T1 at its target size: the victim comes from T2"
    policy.add(2)  # another B1 ghost hit: p grows by max(1, |B2| / |B1|) = 1
    assert policy.p == 2


def test_a_ghost_hit_in_b2_shrinks_p_so_t2_keeps_more():
    """A key evicted from T2 (into B2) and asked for again: T2 was too small, ``p`` shrinks,
    and the next victim comes from T1 again."""
    policy = filled_arc(4, once=[1, 2], twice=[10, 11])
    assert policy.evict(1, set()) == [1]
    policy.add(1)  # B1 hit: p = 1
    assert policy.p == 1 and list(policy.t1) == [2] and list(policy.t2) == [10, 11, 1]
    assert policy.evict(1, set()) == [10], "T1 at its target: T2's oldest goes (to B2)"
    assert list(policy.b2) == [10]
    policy.add(10)  # the B2 ghost hit
    assert policy.p == 0
    assert 10 in policy.t2 and 10 not in policy.b2
    assert policy.evict(1, set()) == [2], "with p back to 0, T1 gives up its key first"


def test_p_moves_by_the_ratio_of_the_ghost_lists():
    """The step is max(1, |B2| / |B1|) on a B1 hit and max(1, |B1| / |B2|) on a B2 hit."""
    policy = filled_arc(8, once=[1, 2, 3, 4], twice=[10, 11, 12, 13])
    policy.p = 4.0
    assert policy.evict(3, set()) == [10, 11, 12]  # |T1| = 4 is not above p: T2 gives up 3
    policy.p = 0.0
    assert policy.evict(1, set()) == [1]
    assert (list(policy.b1), list(policy.b2)) == ([1], [10, 11, 12])
    policy.add(1)  # B1 hit: p grows by |B2| / |B1| = 3
    assert policy.p == 3

    policy = filled_arc(8, once=[1, 2, 3, 4], twice=[10, 11])
    assert policy.evict(3, set()) == [1, 2, 3]  # p = 0: T1 gives up 3
    policy.p = 8.0
    assert policy.evict(1, set()) == [10]  # |T1| = 1 is not above p: T2 gives up 1
    assert (list(policy.b1), list(policy.b2)) == ([1, 2, 3], [10])
    policy.p = 5.0
    policy.add(10)  # B2 hit: p shrinks by |B1| / |B2| = 3
    assert policy.p == 2


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
