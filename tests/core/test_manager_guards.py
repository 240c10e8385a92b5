"""Misuse of the manager's API, and the promises it keeps anyway.

Unbalanced loads never free a slot a tier still reads; calls after ``close`` raise; keys that
are not ``ChunkKey`` are refused at the call; a cold prefix costs a bounded number of probes.
"""

from __future__ import annotations

import threading

import pytest

from kvtier import (
    RETRY,
    ChunkKey,
    ConfigError,
    KVTierError,
    TieringConfig,
    TieringManager,
)
from kvtier.config import FsTierConfig, MemoryTierConfig
from kvtier.config.checks import MAX_LABEL_CHARS
from kvtier.core.promotion import PROBE_AHEAD
from kvtier.errors import ClosedError, HoldError, InvalidKeyError
from kvtier.region import HostRegion
from kvtier.telemetry.kv_events import EventKind
from kvtier.tiers.base import JobResult, Lookup, SecondaryTier, TransferJob
from kvtier.tiers.fault import FaultInjectingTier
from kvtier.tiers.fs.tier import FilesystemTier
from kvtier.tiers.memory import MemoryTier
from tests.conftest import config, fill, holds, make_keys, read, settle, store, wait_for


class GatedTier(SecondaryTier):
    """Holds store jobs back from a real inner tier until ``open`` (a write still running)."""

    def __init__(self, inner: SecondaryTier) -> None:
        self.inner, self.name = inner, inner.name
        self._held: list[TransferJob] = []
        self._open = threading.Event()

    def lookup(self, key: ChunkKey) -> Lookup:
        return self.inner.lookup(key)

    def submit_store(self, job: TransferJob) -> None:
        if self._open.is_set():
            self.inner.submit_store(job)
        else:
            self._held.append(job)

    def submit_load(self, job: TransferJob) -> None:
        self.inner.submit_load(job)

    def open(self) -> None:
        self._open.set()
        for job in self._held:
            self.inner.submit_store(job)

    def get_finished_jobs(self) -> list[JobResult]:
        return list(self.inner.get_finished_jobs())

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def build(identity):
    """``build(slots)``: a manager with no secondary tier, closed after the test."""
    managers: list[TieringManager] = []

    def make(num_slots: int) -> TieringManager:
        managers.append(TieringManager(config(num_slots), identity))
        return managers[-1]

    yield make
    for manager in managers:
        manager.close()


def fs_config(root: str) -> TieringConfig:
    return config(1, secondary_tiers=[{"type": "fs", "root_dir": root}])


def test_an_unbalanced_complete_load_cannot_free_a_slot_being_written_through(identity, tmp_path):
    """The issue's scenario on a real fs tier: nothing wrong may be persisted, even after misuse.

    One host slot holds chunk A while its write to the fs tier is still running. A stray
    ``complete_load([A])`` (and a second one after a real load) must raise and keep A held, so
    ``prepare_store`` of B cannot reuse A's slot; after a restart the fs tier serves A's bytes.
    """
    a, b = make_keys(identity, 2)

    def gated_fs(region, identity):
        return GatedTier(FilesystemTier(FsTierConfig(root_dir=str(tmp_path)), region, identity))

    with TieringManager(config(1), identity, tiers=[gated_fs]) as m:
        gate = m.tiers[0]
        store(m, [a])
        with pytest.raises(HoldError):
            m.complete_load([a])
        m.prepare_load([a])
        m.complete_load([a])
        with pytest.raises(HoldError):
            m.complete_load([a])
        assert m.prepare_store([b]) is None, "A's slot is still read by the fs write"
        gate.open()
        assert m.wait_idle(10)
        plan = m.prepare_store([b])
        assert plan is not None
        fill(m.region, plan.slots[0], b)
        m.complete_store(plan.keys)
        assert m.wait_idle(10)
    with TieringManager(fs_config(str(tmp_path)), identity) as fresh:
        assert settle(fresh, [a]) == 1
        assert read(fresh, [a]), "the fs tier must hold A's own bytes"


def test_complete_load_of_chunks_never_loaded_changes_nothing(build, identity):
    """A release that fails names no slot free: the chunk stays pinned by its real reader."""
    keys = make_keys(identity, 2)
    m = build(2)
    store(m, keys)
    m.prepare_load(keys[:1])
    with pytest.raises(HoldError):
        m.complete_load(keys)  # keys[1] was never loaded: nothing is released
    assert m.stats()["host"]["held_slots"] == 1
    m.complete_load(keys[:1])
    assert m.stats()["host"]["held_slots"] == 0


@pytest.mark.parametrize(
    "method",
    ["prepare_store", "complete_store", "lookup", "prepare_load", "complete_load", "touch"],
)
def test_the_api_after_close_raises(identity, method):
    keys = make_keys(identity, 1)
    m = TieringManager(config(2), identity)
    store(m, keys)
    m.close()
    with pytest.raises(ClosedError):
        getattr(m, method)(keys)
    with pytest.raises(ClosedError):
        m.poll()
    m.close()  # still idempotent
    assert m.stats()["host"]["used_slots"] == 1, "stats stay readable"


@pytest.mark.parametrize(
    "bad",
    [b"\x00" * 32, "abc", [b"\x00" * 32], [1, 2], [None], ["key"]],
    ids=["bytes", "str", "list-of-bytes", "ints", "none", "strs"],
)
def test_keys_that_are_not_chunk_keys_are_refused_at_the_call(build, identity, bad):
    m = build(2)
    for call in (m.prepare_store, m.lookup, m.prepare_load, m.complete_load, m.touch):
        with pytest.raises(InvalidKeyError):
            call(bad)
    with pytest.raises(TypeError):  # InvalidKeyError is also a TypeError ...
        m.complete_store(bad)
    with pytest.raises(KVTierError):  # ... and a KVTierError
        m.lookup(bad)
    assert m.stats()["host"]["used_slots"] == 0 and m.num_pending_jobs == 0


@pytest.mark.parametrize("probe", ["inline", "background"])
def test_a_cold_prefix_costs_a_bounded_number_of_tier_probes(identity, tmp_path, probe):
    """1024 chunks no tier holds, a real fs tier: one lookup probes a few, then stops (probed
    inline, the first miss ends the walk at once)."""
    keys = make_keys(identity, 1024)

    def counted_fs(region, identity):
        fs = FsTierConfig(root_dir=str(tmp_path), probe=probe)  # type: ignore[arg-type]
        return FaultInjectingTier(FilesystemTier(fs, region, identity))

    with TieringManager(config(4), identity, tiers=[counted_fs]) as m:
        counting = m.tiers[0]
        if probe == "inline":
            assert m.lookup(keys) == 0 and counting.calls["lookup"] == 1
            return
        assert m.lookup(keys) is RETRY
        assert counting.calls["lookup"] <= PROBE_AHEAD
        assert settle(m, keys) == 0
        assert counting.calls["lookup"] <= 3 * PROBE_AHEAD


def test_a_long_prefix_another_instance_wrote_is_still_found_whole(identity, tmp_path):
    """A 96-chunk prefix stored through a second manager after the first one scanned its fs
    root: every key has to be probed, and the bounded walk still brings back all of them."""
    keys = make_keys(identity, 96)
    root = str(tmp_path)
    fs = [{"type": "fs", "root_dir": root}]
    with TieringManager(config(128, secondary_tiers=fs), identity) as reader:
        with TieringManager(config(96, secondary_tiers=fs), identity) as writer:
            store(writer, keys)
            assert writer.wait_idle(20)
        assert settle(reader, keys, timeout=30) == 96
        assert read(reader, keys)


def test_events_are_counted_and_loads_and_evictions_are_events(build, identity):
    keys = make_keys(identity, 3)
    m = build(2)
    store(m, keys[:2])
    m.prepare_load(keys[:1])
    m.complete_load(keys[:1])
    store(m, keys[2:])  # evicts keys[1], the least recently used
    events = m.take_events()
    kinds = [(e.kind, e.key) for e in events]
    assert (EventKind.LOADED, keys[0]) in kinds
    assert (EventKind.EVICTED, keys[1]) in kinds
    loaded = next(e for e in events if e.kind is EventKind.LOADED)
    assert (loaded.source, loaded.destination) == ("host", "accelerator")
    counters = m.stats()["counters"]
    by_kind = {k: v for k, v in counters.items() if k.startswith("kvtier_events_total")}
    assert sum(by_kind.values()) == len(events)
    assert counters["kvtier_events_total{kind=loaded}"] == 1


def test_slots_of_loaded_chunks_hold_their_bytes_until_released(build, identity):
    """A held chunk is never evicted, whatever the engine stores meanwhile."""
    keys = make_keys(identity, 3)
    m = build(2)
    store(m, keys[:2])
    slots = m.prepare_load(keys[:2])
    assert m.prepare_store(keys[2:]) is None
    assert all(holds(m.region, s, k) for k, s in zip(keys, slots))
    m.complete_load(keys[:2])
    wait_for(lambda: m.prepare_store(keys[2:]) is not None)


@pytest.mark.parametrize("name", ["memory\nkvtier: forged", "memory\u202e", "", " memory"])
def test_a_hand_built_tier_with_a_name_no_config_would_take_is_refused_and_every_tier_closed(
    identity, name
):
    """``Label`` holds for tiers built by hand too; the manager owns what it is given, so the
    tiers before the bad one, the bad one and those after it are all closed."""
    region = HostRegion(4, identity.layout.chunk_bytes)
    tiers = [MemoryTier(MemoryTierConfig(), region, identity) for _ in range(3)]
    closed = []
    for tier in tiers:
        tier.close = lambda tier=tier, close=tier.close: (closed.append(tier), close())[1]
    tiers[1].name = name
    with pytest.raises(ConfigError, match="tier name"):
        TieringManager(config(4), identity, tiers=tiers, region=region)
    assert {id(t) for t in closed} == {id(t) for t in tiers}


def test_a_hand_built_tier_named_in_any_script_is_served_under_its_name(identity):
    region = HostRegion(4, identity.layout.chunk_bytes)
    tier = MemoryTier(MemoryTierConfig(), region, identity)
    tier.name = "диск 日本"
    with TieringManager(config(4), identity, tiers=[tier], region=region) as m:
        assert m.tier_states() == (["диск 日本"], [])


@pytest.mark.parametrize("inner", ["m" * 93, "memory"])
def test_a_fault_tier_is_named_after_the_tier_it_wraps(identity, inner):
    tiers = [{"type": "fault", "inner": {"type": "memory", "name": inner}}]
    with TieringManager(config(4, secondary_tiers=tiers), identity) as m:
        assert m.tier_states() == ([f"fault({inner})"], [])


def test_fault_tiers_around_tiers_with_the_longest_names_get_names_a_label_takes(identity):
    """An inner name of 100 characters made ``fault(<inner>)`` too long: the manager refused
    to start. It is cut where it must be, and two inner names alike but for their ends still
    give two names (neither needing a ``#i`` to tell them apart)."""
    inners = ["m" * 99 + "a", "m" * 99 + "b"]
    tiers = [{"type": "fault", "inner": {"type": "memory", "name": n}} for n in inners]
    with TieringManager(config(4, secondary_tiers=tiers), identity) as m:
        names, _ = m.tier_states()
    assert len(set(names)) == 2 and all(len(n) <= MAX_LABEL_CHARS for n in names)
    assert all(n.startswith("fault(" + "m" * 80) and "#" not in n for n in names)


def test_tiers_sharing_a_name_of_the_most_characters_allowed_stay_within_it(identity):
    """``#<index>`` tells tiers of one name apart; it pushed a 100-character name past the
    limit every other name keeps (a Prometheus label, a log field)."""
    name = "n" * MAX_LABEL_CHARS
    tiers = [{"type": "memory", "name": name}, {"type": "memory", "name": name}]
    with TieringManager(config(4, secondary_tiers=tiers), identity) as m:
        names, _ = m.tier_states()
    assert names == ["n" * 98 + "#0", "n" * 98 + "#1"]
