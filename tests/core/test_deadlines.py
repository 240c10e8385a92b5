"""Deadlines on tier operations (kvtier.core.deadlines): a tier that hangs never hangs the engine.

A ``HangingTier`` holds a real tier's jobs (or answers ``RETRY`` to its lookups) until it is
released, as an NFS server that went away would. Past a deadline the engine stops waiting (a
miss, reason ``tier_timeout``), keeps storing, the SLO guard trips the tier, and the late I/O,
when it comes, lands only in the slot reserved for it.
"""

from __future__ import annotations

import threading
import time

import pytest

from kvtier import HIT, RETRY, ChunkKey, TieringManager
from kvtier.config import MemoryTierConfig
from kvtier.core.deadlines import WRITE_THROUGH_SHARE, ProbeAges, TierDeadlines
from kvtier.core.host_slots import WRITING
from kvtier.identity import CacheIdentity
from kvtier.region import HostRegion
from kvtier.tiers.base import JobResult, Lookup, SecondaryTier, TransferJob
from kvtier.tiers.memory import MemoryTier
from tests.conftest import config, fill, holds, make_keys, push_out, read, store, wait_for
from tests.tiers.peer_node import PeerNode

SHORT = 0.2  # seconds: every deadline in these tests


class HangingTier(SecondaryTier):
    """A real memory tier whose loads, stores or probes hang until ``release``."""

    def __init__(self, region: HostRegion, identity: CacheIdentity) -> None:
        self.inner = MemoryTier(MemoryTierConfig(), region, identity)
        self.name = "hanging"
        self.hang: set[str] = set()  # of "load", "store", "probe"
        self.held: list[tuple[str, TransferJob]] = []
        self.loads_submitted = 0
        self._lock = threading.Lock()

    def lookup(self, key: ChunkKey) -> Lookup:
        return RETRY if "probe" in self.hang else self.inner.lookup(key)

    def submit_load(self, job: TransferJob) -> None:
        self.loads_submitted += 1
        self._submit("load", job)

    def submit_store(self, job: TransferJob) -> None:
        self._submit("store", job)

    def _submit(self, op: str, job: TransferJob) -> None:
        with self._lock:
            if op in self.hang:
                self.held.append((op, job))
                return
        (self.inner.submit_load if op == "load" else self.inner.submit_store)(job)

    def release(self) -> None:
        """The hang ends: every held job reaches the real tier now, late."""
        with self._lock:
            self.hang.clear()
            held, self.held = self.held, []
        for op, job in held:
            (self.inner.submit_load if op == "load" else self.inner.submit_store)(job)

    def get_finished_jobs(self) -> list[JobResult]:
        return list(self.inner.get_finished_jobs())

    def close(self) -> None:
        self.release()
        self.inner.close()


def manager(identity: CacheIdentity, slots: int, **extra: object) -> TieringManager:
    deadlines = {"promotion_s": SHORT, "store_s": SHORT, "probe_s": SHORT}
    cfg = config(slots, deadlines=deadlines, **extra)
    return TieringManager(cfg, identity, tiers=[HangingTier])


def hanging(m: TieringManager) -> HangingTier:
    tier = m.tiers[0]
    assert isinstance(tier, HangingTier)
    return tier


def recomputed(m: TieringManager, reason: str) -> float:
    return m.metrics.flat().get(f"kvtier_recomputed_chunks_total{{reason={reason}}}", 0)


def in_tier_only(m: TieringManager, identity: CacheIdentity, n: int) -> list[ChunkKey]:
    """``n`` chunks written through to the tier, then pushed out of host memory."""
    keys = make_keys(identity, n, seed=7)
    store(m, keys)
    push_out(m, identity, m.region.num_slots)
    assert all(k not in m.host for k in keys)
    return keys


def test_a_hung_promotion_is_a_miss_past_its_deadline_and_lands_late_in_its_own_slot(identity):
    with manager(identity, 8) as m:
        keys = in_tier_only(m, identity, 4)
        tier = hanging(m)
        tier.hang.add("load")
        assert m.lookup(keys) is RETRY  # the promotion is submitted, and hangs
        wait_for(lambda: m.lookup(keys) == 0, timeout=10, what="a miss past the deadline")
        assert recomputed(m, "tier_timeout") == 4
        assert all(m.host.state_of(k) == WRITING for k in keys)  # reserved, never reused
        others = make_keys(identity, 4, seed=99)
        plan = store(m, others)  # the engine keeps storing, into the other slots
        promoted = {m.host.slot_of(k) for k in keys if m.host.slot_of(k) is not None}
        assert not promoted & set(plan.slots)
        tier.release()  # the late read lands now
        wait_for(lambda: m.poll() >= 0 and all(m.host.is_ready(k) for k in keys), timeout=10)
        assert read(m, keys) and read(m, others)  # its own bytes, and nobody else's touched


def test_a_tier_stalled_on_a_promotion_is_given_no_new_one(identity):
    with manager(identity, 16) as m:
        first, second = in_tier_only(m, identity, 4), make_keys(identity, 2, seed=8)
        store(m, second)
        push_out(m, identity, 16, seed=2000)
        tier = hanging(m)
        tier.hang.add("load")
        assert m.lookup(first) is RETRY
        wait_for(lambda: m.lookup(first) == 0, timeout=10, what="a miss past the deadline")
        submitted = tier.loads_submitted
        assert m.lookup(second) == 0  # held by the stalled tier: not asked, a miss at once
        assert tier.loads_submitted == submitted
        assert recomputed(m, "tier_timeout") == 6


def test_a_probe_that_never_ends_is_a_miss_past_its_deadline(identity):
    with manager(identity, 8) as m:
        hanging(m).hang.add("probe")
        keys = make_keys(identity, 3, seed=5)
        assert m.lookup(keys) is RETRY
        wait_for(lambda: m.lookup(keys) == 0, timeout=10, what="a miss past the probe deadline")
        assert recomputed(m, "tier_timeout") == 3


def test_hung_writes_never_starve_the_engines_stores(identity):
    slots = 32
    with manager(identity, slots) as m:
        hanging(m).hang.add("store")
        refused = 0
        for seed in range(100):
            plan = m.prepare_store(make_keys(identity, 1, seed=10_000 + seed))
            refused += plan is None
            if plan is not None:
                fill(m.region, plan.slots[0], plan.keys[0])
                m.complete_store(plan.keys)
        assert refused == 0
        assert m._tiers.chunks_in_flight("store") <= slots * WRITE_THROUGH_SHARE
        dropped = m.metrics.flat()
        assert dropped["kvtier_admission_dropped_total{reason=tier_busy,tier=hanging}"] > 0
        time.sleep(SHORT * 2)
        m.poll()  # the engine's next poll (every lookup polls) finds the late writes
        plan = store(m, make_keys(identity, 1, seed=77))
        assert plan.slots and holds(m.region, plan.slots[0], plan.keys[0])
        flat = m.metrics.flat()
        assert flat["kvtier_admission_dropped_total{reason=tier_timeout,tier=hanging}"] == 1
        assert flat["kvtier_tier_timeouts_total{op=store,tier=hanging}"] >= 1


def test_the_slo_guard_trips_a_tier_that_hangs(identity):
    guard = {"promotion_p99_s": SHORT, "min_samples": 1, "sustain_s": 0.05, "window_s": 60}
    with manager(identity, 8, slo_guard=guard) as m:
        keys = in_tier_only(m, identity, 2)
        hanging(m).hang.add("load")
        assert m.lookup(keys) is RETRY

        def tripped() -> bool:
            m.poll()
            return m.tier_states()[1] == ["hanging"]

        wait_for(tripped, timeout=10, what="the guard switching the hung tier off")


def test_a_late_promotion_is_one_sample_to_the_slo_guard(identity):
    """Counted when its deadline passes and not again when it reports: with ``min_samples``
    2, one late promotion leaves the tier on, and a second one switches it off."""
    guard = {"promotion_p99_s": SHORT, "min_samples": 2, "sustain_s": 0.05, "window_s": 60}
    with manager(identity, 16, slo_guard=guard) as m:
        keys = in_tier_only(m, identity, 4)
        tier = hanging(m)
        tier.hang.add("load")
        assert m.lookup(keys[:2]) is RETRY
        wait_for(lambda: m.lookup(keys[:2]) == 0, timeout=10, what="a miss past the deadline")
        tier.release()
        wait_for(lambda: m.poll() >= 0 and all(m.host.is_ready(k) for k in keys[:2]), 10)
        for _ in range(5):  # the guard sees the late report, then waits out sustain_s
            m.poll()
            time.sleep(0.05)
        assert m.tier_states()[1] == [], "one late promotion was counted twice"
        tier.hang.add("load")
        assert m.lookup(keys[2:]) is RETRY

        def tripped() -> bool:
            m.poll()
            return m.tier_states()[1] == ["hanging"]

        wait_for(tripped, timeout=10, what="the second late promotion tripping the guard")


def test_late_stores_are_not_failed_promotions_to_the_slo_guard(identity):
    """A tier whose writes hang past their deadline, and whose promotions are quick, is not
    switched off for a promotion budget: a late store is not a promotion."""
    guard = {"promotion_p99_s": SHORT, "min_samples": 1, "sustain_s": 0.05, "window_s": 60}
    with manager(identity, 8, slo_guard=guard) as m:
        hanging(m).hang.add("store")
        store(m, make_keys(identity, 2, seed=5))  # written through, then held by the tier
        time.sleep(SHORT * 2)
        for _ in range(5):  # the guard sees the late stores, then waits out sustain_s
            m.poll()
            time.sleep(0.05)
        assert m.metrics.flat()["kvtier_tier_timeouts_total{op=store,tier=hanging}"] >= 1
        assert m.tier_states()[1] == [], "a late store tripped the promotion budget"


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf"), 86_401, True, "5"])
def test_a_deadline_that_is_not_a_positive_number_of_seconds_is_refused(seconds):
    from kvtier.errors import ConfigError

    with pytest.raises(ConfigError, match=r"deadlines\.promotion_s"):
        config(4, deadlines={"promotion_s": seconds})


@pytest.mark.parametrize("seconds", [1e-6, 86_400])
def test_deadlines_at_the_ends_of_the_range_are_accepted(seconds):
    assert config(4, deadlines={"store_s": seconds}).deadlines.store_s == seconds


def test_a_probe_is_late_only_past_its_deadline_and_settling_starts_it_anew():
    now = [100.0]
    probes = ProbeAges(5.0, clock=lambda: now[0])
    key = ChunkKey(b"k" * 32)
    assert not probes.late(0, key)
    now[0] = 105.0
    assert not probes.late(0, key)  # exactly at the deadline: not yet late
    now[0] = 105.001
    assert probes.late(0, key) and not probes.late(1, key)  # per tier
    probes.settled(0, key)
    assert not probes.late(0, key)


def test_a_job_deadline_is_its_kind_of_deadline():
    deadlines = TierDeadlines(promotion_s=1.0, store_s=2.0, probe_s=3.0)
    assert (deadlines.of("load"), deadlines.of("store")) == (1.0, 2.0)


def test_a_peer_process_that_stops_answering_never_stops_the_engine(identity):
    """A real peer node, frozen (SIGSTOP) with its chunks found: the fetch goes out and is never
    answered. The p2p tier's own timeout is far away; the promotion deadline is what ends the
    wait, and the engine meanwhile stores and serves its own chunks."""
    node = PeerNode(0, "--store", "4").start()
    p2p = {"type": "p2p", "host": "127.0.0.1", "port": node.port, "timeout_s": 600.0}
    deadlines = {"promotion_s": SHORT, "store_s": SHORT, "probe_s": 5.0}
    cfg = config(16, secondary_tiers=[p2p], deadlines=deadlines)
    try:
        with TieringManager(cfg, identity) as m:
            keys = make_keys(identity, 4)  # what the node stored (same seed, same identity)
            tier = m.tiers[0]
            wait_for(lambda: all(tier.lookup(k) is HIT for k in keys), what="the node's chunks")
            node.freeze()  # found, and now the fetch goes out and is never answered
            assert m.lookup(keys) is RETRY
            wait_for(lambda: m.lookup(keys) == 0, timeout=30, what="a miss past the deadline")
            assert recomputed(m, "tier_timeout") >= 1
            own = make_keys(identity, 4, seed=123)
            store(m, own)
            assert m.lookup(own) == 4 and read(m, own)
    finally:
        node.kill()


def test_a_probe_answered_miss_starts_its_next_wait_anew(identity):
    """A key the tier probed and found missing, probed again long after (its miss forgotten,
    another instance may have stored it), waits its own deadline: the first wait's start does
    not make the second late at once (``tier_timeout``)."""
    with manager(identity, 8) as m:
        tier = hanging(m)
        keys = make_keys(identity, 2, seed=6)
        tier.hang.add("probe")
        assert m.lookup(keys) is RETRY
        tier.release()
        assert m.lookup(keys) == 0  # the tier answered MISS in time
        time.sleep(SHORT * 2)
        tier.hang.add("probe")
        assert m.lookup(keys) is RETRY, "a new wait, not one begun before the miss"
        assert recomputed(m, "tier_timeout") == 0
