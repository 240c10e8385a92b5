"""Progress signals: a tier wakes a waiting engine once a job's result or a new answer is there.

No test here bounds a duration: each checks what is true when the signal arrives.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kvtier import RETRY, TieringManager
from kvtier.config import FsTierConfig, MemoryTierConfig
from kvtier.core.progress import Progress
from kvtier.identity import CacheIdentity
from kvtier.region import HostRegion
from kvtier.tiers.base import MISS, SecondaryTier, TransferJob
from kvtier.tiers.fault import FaultInjectingTier
from kvtier.tiers.fs.tier import FilesystemTier
from kvtier.tiers.memory import MemoryTier
from tests.conftest import config, fill, make_keys, push_out, read, store


@pytest.fixture
def region(identity: CacheIdentity) -> HostRegion:
    return HostRegion(8, identity.layout.chunk_bytes)


def test_a_job_result_is_there_when_its_signal_arrives(region, identity):
    tier = MemoryTier(MemoryTierConfig(), region, identity)
    signalled, seen = threading.Event(), []
    tier.bind_progress(lambda: (seen.extend(tier.get_finished_jobs()), signalled.set()))
    try:
        keys = make_keys(identity, 2)
        for slot, key in enumerate(keys):
            fill(region, slot, key)
        tier.submit_store(TransferJob(1, tuple(keys), (0, 1)))
        assert signalled.wait(20)
        assert [r.job_id for r in seen] == [1] and seen[0].ok
    finally:
        tier.close()


def test_an_fs_probe_signals_once_its_answer_is_known(tmp_path: Path, region, identity):
    config = FsTierConfig(root_dir=str(tmp_path), probe="background")
    tier = FilesystemTier(config, region, identity)
    signalled = threading.Event()
    tier.bind_progress(signalled.set)
    try:
        (key,) = make_keys(identity, 1, seed=7)
        assert tier.wait_scanned(20)
        assert tier.lookup(key) is RETRY
        assert signalled.wait(20)
        assert tier.lookup(key) is MISS
    finally:
        tier.close()


def test_a_signal_between_arm_and_wait_is_not_lost(region, identity):
    progress = Progress([MemoryTier(MemoryTierConfig(), region, identity)])
    progress.arm()
    progress.notify()
    assert progress.wait(20)
    progress.arm()
    assert not progress.wait(0)


def test_tiers_that_do_not_signal_are_polled(region, identity):
    """A wrapped tier cannot promise signals: waits end by themselves (they would hang the test
    otherwise), and the lookup loop still settles."""
    inner = MemoryTier(MemoryTierConfig(), region, identity)
    tiers: list[SecondaryTier] = [FaultInjectingTier(inner)]
    assert not tiers[0].signals_progress and inner.signals_progress
    progress = Progress(tiers)
    progress.arm()
    assert not progress.wait(3600)
    inner.close()


def test_lookup_then_wait_progress_settles_a_promotion(identity):
    m = TieringManager(
        config(4),
        identity,
        tiers=[lambda region, identity: MemoryTier(MemoryTierConfig(), region, identity)],
    )
    try:
        keys = make_keys(identity, 4)
        store(m, keys)
        push_out(m, identity, 4)
        answers = []
        while (answer := m.lookup(keys)) is RETRY:
            answers.append(answer)
            m.wait_progress(3600)  # returns at the signal (or the cap), never after an hour
        assert answers and answer == 4 and read(m, keys)
    finally:
        m.close()
