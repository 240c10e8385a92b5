"""JobRunner and PooledTier: a load job split into parts reports once, after its last part.

The parts of a job run on the read pool at once; the job's result holds every part's keys
(a part that raised fails only its own), ``_loaded`` runs once after the last part, and a job
too small to split is one ``_load`` of the job itself.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pytest

from kvtier.keys import ChunkKey
from kvtier.tiers.base import JobOutcome, JobResult, TransferJob
from kvtier.tiers.shared.jobs import JobRunner, PooledTier, split_job

TIMEOUT_S = 10.0


def k(i: int) -> ChunkKey:
    return ChunkKey(i.to_bytes(32, "big"))


def job_of(n: int, job_id: int = 7) -> TransferJob:
    return TransferJob(job_id, tuple(k(i) for i in range(n)), tuple(range(100, 100 + n)))


@pytest.mark.parametrize(
    ("n", "fewest", "most", "sizes"),
    [
        (25, 4, 16, [5, 4, 4, 4, 4, 4]),  # 25 // 4 = 6 parts
        (8, 4, 16, [4, 4]),
        (7, 4, 16, [7]),  # two parts would leave one under 4 chunks
        (4, 4, 16, [4]),
        (25, 4, 2, [13, 12]),  # no more parts than threads
        (25, 4, 1, [25]),
        (25, 0, 16, [25]),  # 0: never split
        (0, 4, 16, [0]),
    ],
)
def test_a_job_splits_into_consecutive_parts_of_at_least_the_fewest_chunks(n, fewest, most, sizes):
    job = job_of(n)
    parts = split_job(job, fewest, most)
    assert [len(p.keys) for p in parts] == sizes
    assert all(p.job_id == job.job_id for p in parts)
    assert tuple(key for p in parts for key in p.keys) == job.keys
    assert tuple(slot for p in parts for slot in p.slots) == job.slots
    if len(parts) == 1:
        assert parts[0] is job


def test_links_are_split_with_their_keys():
    from kvtier.tiers.shared.lineage import Link

    links = tuple(Link(bytes([i]) * 32, i) for i in range(8))
    job = TransferJob(3, tuple(k(i) for i in range(8)), tuple(range(8)), links)
    parts = split_job(job, 4, 4)
    assert [p.links for p in parts] == [links[:4], links[4:]]


class Tier(PooledTier):
    """A pooled tier whose loads record what they were given and can be held or made to fail."""

    def __init__(self, threads: int, fewest: int) -> None:
        self.name = "parts"
        self._runner = JobRunner("parts", threads, 1)
        self.load_part_chunks, self.load_threads = fewest, threads
        self.parts: list[tuple[ChunkKey, ...]] = []
        self.loaded: list[int] = []
        self.hold: dict[ChunkKey, threading.Event] = {}
        self.fail: set[ChunkKey] = set()
        self.corrupt: set[ChunkKey] = set()
        self.meet: threading.Barrier | None = None

    def lookup(self, key: ChunkKey):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def close(self) -> None:
        self._runner.close()

    def _store(self, job: TransferJob) -> Iterable[ChunkKey]:
        return job.keys

    def _load(self, job: TransferJob) -> JobOutcome:
        self.parts.append(job.keys)
        if self.meet is not None:
            self.meet.wait(TIMEOUT_S)  # every part in flight at once, or BrokenBarrierError
        if job.keys[0] in self.hold:
            assert self.hold[job.keys[0]].wait(TIMEOUT_S)
        if self.fail & set(job.keys):
            raise OSError("disk gone")
        bad = [key for key in job.keys if key in self.corrupt]
        return JobOutcome([key for key in job.keys if key not in bad], bad)

    def _loaded(self, job: TransferJob) -> None:
        self.loaded.append(job.job_id)


def results(tier: Tier, count: int = 1) -> list[JobResult]:
    got: list[JobResult] = []
    done = threading.Event()
    tier._runner.on_result = done.set
    while len(got) < count:
        got += tier.get_finished_jobs()
        if len(got) < count:
            assert done.wait(TIMEOUT_S), "a job never reported"
            done.clear()
    return got


def test_the_parts_of_a_job_run_at_once_and_it_reports_once_with_every_key():
    tier = Tier(threads=3, fewest=4)
    tier.meet = threading.Barrier(3)
    job = job_of(12)
    tier.corrupt = {k(5)}
    tier.submit_load(job)
    [result] = results(tier)
    assert sorted(tier.parts) == sorted([job.keys[:4], job.keys[4:8], job.keys[8:]])
    assert result.job_id == job.job_id
    assert result.succeeded == frozenset(job.keys) - {k(5)}
    assert result.integrity_failed == {k(5)}
    assert tier.loaded == [job.job_id]
    assert tier.get_finished_jobs() == []  # once
    tier.close()


def test_the_job_reports_only_after_its_last_part():
    tier = Tier(threads=2, fewest=4)
    tier.hold[k(4)] = threading.Event()
    tier.submit_load(job_of(8))
    threading.Event().wait(0.2)  # the first part is done by now; the job must not be
    assert tier.get_finished_jobs() == [] and tier.loaded == []
    tier.hold[k(4)].set()
    [result] = results(tier)
    assert result.succeeded == frozenset(job_of(8).keys)
    assert tier.loaded == [7]
    tier.close()


def test_a_part_that_raises_fails_its_own_keys_and_the_others_count():
    tier = Tier(threads=2, fewest=4)
    tier.fail = {k(6)}
    job = job_of(8)
    tier.submit_load(job)
    [result] = results(tier)
    assert result.succeeded == frozenset(job.keys[:4])
    assert result.failed == frozenset(job.keys[4:])
    assert result.error is not None and "disk gone" in result.error
    assert tier.loaded == [job.job_id]
    tier.close()


def test_a_finish_that_raises_still_reports_the_job():
    tier = Tier(threads=2, fewest=4)

    def broken(job: TransferJob) -> None:
        raise RuntimeError("bookkeeping bug")

    tier._loaded = broken  # type: ignore[method-assign]
    tier.submit_load(job_of(8))
    [result] = results(tier)
    assert result.succeeded == frozenset(job_of(8).keys)
    tier.close()


def test_a_small_job_is_one_load_of_the_job_itself():
    tier = Tier(threads=4, fewest=4)
    job = job_of(7)
    tier.submit_load(job)
    [result] = results(tier)
    assert tier.parts == [job.keys] and result.succeeded == frozenset(job.keys)
    assert tier.loaded == [job.job_id]
    tier.close()


def test_a_closed_runner_reports_a_split_job_failed_once():
    tier = Tier(threads=2, fewest=4)
    tier.close()
    tier.submit_load(job_of(8))
    [result] = tier.get_finished_jobs()
    assert result.succeeded == frozenset() and result.error == "tier is closed"
    assert tier.parts == [] and tier.get_finished_jobs() == []
