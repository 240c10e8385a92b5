"""HostTier: slot states, and eviction that never takes a slot being written or held."""

from __future__ import annotations

import pytest

from kvtier.core.host_slots import WRITING, HoldError, HostTier


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_never_evicts_a_slot_being_written_or_held(policy):
    """Two slots: one being written, one held by a reader. Nothing can be allocated."""
    host = HostTier(2, policy)
    assert host.allocate(["w"]) is not None
    host.allocate(["r"])
    host.complete_write(["r"], success=True)
    host.hold(["r"], "reader")
    assert host.allocate(["new"]) is None
    assert host.state_of("w") == WRITING and host.state_of("r") == 1
    host.release(["r"], "reader")
    slots, evicted = host.allocate(["new"])
    assert evicted == ["r"] and slots == [host.slot_of("new")]


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_hold_is_counted_per_holder(policy):
    host = HostTier(1, policy)
    host.allocate(["a"])
    host.complete_write(["a"], success=True)
    host.hold(["a"], "reader")
    host.hold(["a"], "reader")
    host.release(["a"], "reader")
    assert host.allocate(["b"]) is None
    host.release(["a"], "reader")
    assert host.allocate(["b"]) is not None


def test_failed_write_frees_the_slot():
    host = HostTier(1)
    (slot,), _ = host.allocate(["a"])
    host.complete_write(["a"], success=False)
    assert "a" not in host and host.num_free == 1
    assert host.allocate(["b"]) == ([slot], [])


def test_counts_follow_the_states():
    host = HostTier(4)
    host.allocate(["a", "b", "c"])
    host.complete_write(["a", "b"], success=True)
    host.hold(["a"], "reader")
    assert (len(host), host.num_free, host.num_held, host.num_allocatable) == (3, 1, 2, 2)
    host.release(["a"], "reader")
    assert host.num_held == 1 and host.num_allocatable == 3


def test_allocation_failure_changes_nothing():
    host = HostTier(2)
    host.allocate(["a", "b"])
    host.complete_write(["a", "b"], success=True)
    host.hold(["a"], "reader")
    assert host.allocate(["c", "d"]) is None
    assert host.is_ready("a") and host.is_ready("b") and host.num_free == 0


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_an_owner_cannot_release_another_owners_hold(policy):
    """A writer and a reader hold "a"; the reader releasing twice raises and leaves "a" held."""
    host = HostTier(1, policy)
    host.allocate(["a"])
    host.complete_write(["a"], success=True)
    host.hold(["a"], "writer")
    host.hold(["a"], "reader")
    host.release(["a"], "reader")
    with pytest.raises(HoldError):
        host.release(["a"], "reader")
    assert host.state_of("a") == 1 and host.allocate(["b"]) is None
    host.release(["a"], "writer")
    assert host.allocate(["b"]) is not None


def test_a_release_that_fails_changes_nothing():
    """Releasing ["a", "b"] where "b" is not held by the owner releases neither."""
    host = HostTier(2)
    host.allocate(["a", "b"])
    host.complete_write(["a", "b"], success=True)
    host.hold(["a"], "reader")
    with pytest.raises(HoldError):
        host.release(["a", "b"], "reader")
    with pytest.raises(HoldError):
        host.release(["a", "a"], "reader")
    assert host.state_of("a") == 1 and host.state_of("b") == 0
    assert host.holds_of("reader") == ["a"]
    host.hold(["a"], "reader")  # a release that fails after emptying a hold puts it back
    with pytest.raises(HoldError):
        host.release(["a", "a", "a"], "reader")
    assert host.state_of("a") == 2 and host.num_held == 1
    assert host.holds_of("reader") == ["a", "a"] and host.holds_of("stranger") == []
