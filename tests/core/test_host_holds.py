"""Holds on host slots against a reference model: every mix of owners and of held and unheld
keys (hypothesis).

An owner's release of keys it holds (as many times as listed) drops one hold each; a release
naming any key it does not hold raises ``HoldError`` and changes nothing at all, whichever
position the unheld key has and whatever other owners hold. ``can_release``, ``holds_of``,
``held_by_kind``, the slot states and the counts always agree with the model.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.core.host_slots import HoldError, HostTier, WriteThrough

KEYS = ["a", "b", "c", "d"]
WRITE_A, WRITE_B = WriteThrough("fs"), WriteThrough("fs")  # two jobs: two owners
OWNERS = ["engine", "peer", WRITE_A, WRITE_B]

OPS = st.lists(
    st.tuples(
        st.sampled_from(["hold", "release", "can_release"]),
        st.lists(st.sampled_from(KEYS), min_size=1, max_size=4),
        st.sampled_from(range(len(OWNERS))),
    ),
    max_size=40,
)


class Model:
    def __init__(self) -> None:
        self.holds: dict[object, Counter[str]] = {owner: Counter() for owner in OWNERS}

    def can_release(self, keys: list[str], owner: object) -> bool:
        return all(self.holds[owner][key] >= n for key, n in Counter(keys).items())

    def total(self, key: str) -> int:
        return sum(held[key] for held in self.holds.values())


def ready_host() -> HostTier:
    host = HostTier(len(KEYS) + 2)
    host.allocate(KEYS)
    host.complete_write(KEYS, success=True)
    return host


def check(host: HostTier, model: Model) -> None:
    for key in KEYS:
        assert host.state_of(key) == model.total(key), key
    for owner in OWNERS:
        assert Counter(host.holds_of(owner)) == +model.holds[owner], owner
    kind = {key for owner in (WRITE_A, WRITE_B) for key in +model.holds[owner]}
    assert host.held_by_kind(WriteThrough) == kind
    held = sum(model.total(key) > 0 for key in KEYS)
    assert host.num_held == held
    assert host.num_allocatable == host.num_free + len(KEYS) - held


@settings(max_examples=400, deadline=None)
@given(OPS)
def test_holds_and_releases_follow_the_reference_model(ops):
    host, model = ready_host(), Model()
    for name, keys, index in ops:
        owner = OWNERS[index]
        if name == "hold":
            assert host.hold(keys, owner) == [host.slot_of(key) for key in keys]
            model.holds[owner].update(keys)
        elif name == "can_release":
            assert host.can_release(keys, owner) is model.can_release(keys, owner)
        elif model.can_release(keys, owner):
            host.release(keys, owner)
            model.holds[owner].subtract(keys)
        else:
            with pytest.raises(HoldError):
                host.release(keys, owner)
        check(host, model)


@pytest.mark.parametrize(
    "keys",
    [["x", "a"], ["a", "x"], ["a", "x", "b"], ["x", "x"], ["a", "a", "a"], ["b", "a", "b", "b"]],
)
def test_a_release_with_an_unheld_key_anywhere_changes_nothing(keys):
    """The owner holds "a" twice and "b" twice; "x" (ready) is held by another owner only."""
    host = HostTier(4)
    host.allocate(["a", "b", "x"])
    host.complete_write(["a", "b", "x"], success=True)
    host.hold(["a", "a", "b", "b"], "owner")
    host.hold(["x"], "other")
    with pytest.raises(HoldError):
        host.release(keys, "owner")
    assert Counter(host.holds_of("owner")) == Counter({"a": 2, "b": 2})
    assert host.holds_of("other") == ["x"]
    assert [host.state_of(k) for k in ("a", "b", "x")] == [2, 2, 1]
    assert not host.can_release(keys, "owner")
