"""Running a tier's jobs: plain functions on separate read and write thread pools.

``JobRunner`` runs job functions and collects their ``JobResult``s (a store succeeds or fails as
a whole; a load reports each key); ``PooledTier`` is a tier whose ``submit_*`` and
``get_finished_jobs`` are exactly that; ``drain`` empties a result queue without waiting.

A load job of many chunks may run as several parts on the read pool at once
(``PooledTier.load_part_chunks``): a request that needs 25 chunks back then waits for the
slowest part, not for 25 reads one after another (a promotion is one job per tier, and the
engine waits for it). The job still reports once, after its last part.

Thread safety: ``JobRunner.submit`` and ``finished`` may be called from any thread; the job
functions, and a job's ``finish``, run on the pools' threads.
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable
from typing import TypeVar

from kvtier.keys import ChunkKey
from kvtier.telemetry.logs import ThrottledLog
from kvtier.tiers.base import JobOutcome, JobResult, Op, SecondaryTier, TransferJob, job_result
from kvtier.tiers.shared import workers
from kvtier.tiers.shared.workers import WorkerPool

log = logging.getLogger(__name__)
warn = ThrottledLog(log)

T = TypeVar("T")


def drain(results: queue.SimpleQueue[T]) -> list[T]:
    """Everything in ``results`` now, without waiting (for ``get_finished_jobs``)."""
    items = []
    while True:
        try:
            items.append(results.get_nowait())
        except queue.Empty:
            return items


JobFunction = Callable[[], "Iterable[ChunkKey] | JobOutcome"]


def _nothing() -> None:
    pass


class _Gather:
    """The outcomes of one job's parts, until the last part has reported (any thread)."""

    def __init__(self, parts: int) -> None:
        self._lock = threading.Lock()
        self._left = parts
        self._succeeded: list[ChunkKey] = []
        self._integrity_failed: list[ChunkKey] = []
        self.error: str | None = None

    def add(self, outcome: JobOutcome, error: str | None) -> bool:
        """Count one part's outcome; ``True`` for the job's last part."""
        with self._lock:
            self._succeeded += outcome.succeeded
            self._integrity_failed += outcome.integrity_failed
            self.error = self.error or error
            self._left -= 1
            return self._left == 0

    def outcome(self) -> JobOutcome:
        return JobOutcome(self._succeeded, self._integrity_failed)


class JobRunner:
    """Runs job functions on separate read and write thread pools; collects their results.

    A job function returns the keys that succeeded (or a ``JobOutcome``); an exception fails
    every key of the job. ``on_result`` is called on the pool's thread after each result is
    queued. Thread safety: ``submit`` and ``finished`` may be called from any thread.
    """

    on_result: Callable[[], None] = staticmethod(lambda: None)

    def __init__(self, name: str, n_read_threads: int, n_write_threads: int) -> None:
        self._name = name
        self._readers = WorkerPool(n_read_threads, f"{name}-read")
        self._writers = WorkerPool(n_write_threads, f"{name}-write")
        self._results: queue.SimpleQueue[JobResult] = queue.SimpleQueue()
        self._closed = threading.Event()

    def submit(
        self,
        op: Op,
        job: TransferJob,
        fn: JobFunction,
        *more: JobFunction,
        finish: Callable[[], None] = _nothing,
    ) -> None:
        """Run ``fn`` (and each of ``more``: parts of the same job, at once where threads are
        free); the job reports once, after its last part, which first calls ``finish``. A part
        that raises fails its own keys; the others' still count."""
        if self._closed.is_set():
            self._results.put(self._result(op, job, JobOutcome(()), "tier is closed"))
            return
        pool = self._readers if op == "load" else self._writers
        parts = (fn, *more)
        gather = _Gather(len(parts))
        for part in parts:
            if not pool.submit(functools.partial(self._run, op, job, part, gather, finish)):
                self._results.put(self._result(op, job, JobOutcome(()), "tier is closed"))
                return

    def _run(
        self, op: Op, job: TransferJob, fn: JobFunction, gather: _Gather, finish: Callable[[], None]
    ) -> None:
        try:
            outcome, error = fn(), None
        except Exception as exc:  # a worker must report, never die silently
            warn.warning(f"{op}:{type(exc).__name__}", "%s job %d failed: %s", op, job.job_id, exc)
            outcome, error = (), f"{type(exc).__name__}: {exc}"
        if not isinstance(outcome, JobOutcome):
            outcome = JobOutcome(outcome)
        if not gather.add(outcome, error):
            return
        try:
            finish()
        except Exception as exc:  # bookkeeping after the I/O: what the parts did still counts
            warn.warning(f"{op}:finish", "%s job %d: finishing failed: %s", op, job.job_id, exc)
        self._results.put(self._result(op, job, gather.outcome(), gather.error))
        self.on_result()

    @staticmethod
    def _result(op: Op, job: TransferJob, outcome: JobOutcome, error: str | None) -> JobResult:
        return job_result(job, op, outcome.succeeded, error, outcome.integrity_failed)

    def finished(self) -> list[JobResult]:
        return drain(self._results)

    def close(self, timeout: float | None = None) -> list[str]:
        """Stop accepting jobs, finish the queued ones and stop the threads, waiting ``timeout``
        seconds at most (default ``workers.CLOSE_WAIT_S``): the threads still busy then (a job
        stuck in I/O) are left running, named in a warning and returned."""
        self._closed.set()
        deadline = time.monotonic() + (workers.CLOSE_WAIT_S if timeout is None else timeout)
        busy = self._readers.close(workers.left(deadline))
        busy += self._writers.close(workers.left(deadline))
        if busy:
            log.warning("%s: %s still busy at close; left running", self._name, ", ".join(busy))
        return busy


class PooledTier(SecondaryTier):
    """A tier whose jobs are plain functions run on a ``JobRunner``'s read and write pools.

    Subclasses set ``self._runner`` and implement ``_store(job)`` and ``_load(job)``, each
    returning the keys that succeeded (or a ``JobOutcome``); ``close`` must close the runner.
    Every job result signals progress; a subclass whose ``lookup`` can answer ``RETRY`` must
    call ``notify_progress`` when that answer may change (or set ``signals_progress`` False).

    With ``load_part_chunks`` > 0 a load job runs as parts of at least that many chunks (as
    many parts as ``load_threads`` allows, in key order), each a ``_load`` of a job with the
    same id; ``_loaded(job)`` then runs once, after the last part. Without it the whole job is
    one ``_load``, then ``_loaded``.
    """

    _runner: JobRunner
    signals_progress = True
    #: The fewest chunks a part of a split load job has; 0: jobs are never split.
    load_part_chunks = 0
    #: The most parts a load job is cut into (each runs on its own read thread).
    load_threads = 1

    def bind_progress(self, notify: Callable[[], None]) -> None:
        super().bind_progress(notify)
        self._runner.on_result = notify

    def submit_store(self, job: TransferJob) -> None:
        self._runner.submit("store", job, lambda: self._store(job))

    def submit_load(self, job: TransferJob) -> None:
        parts = split_job(job, self.load_part_chunks, self.load_threads)
        loads = [lambda part=part: self._load(part) for part in parts]
        self._runner.submit("load", job, *loads, finish=lambda: self._loaded(job))

    def get_finished_jobs(self) -> list[JobResult]:
        return self._runner.finished()

    @abstractmethod
    def _store(self, job: TransferJob) -> Iterable[ChunkKey] | JobOutcome: ...

    @abstractmethod
    def _load(self, job: TransferJob) -> Iterable[ChunkKey] | JobOutcome: ...

    def _loaded(self, job: TransferJob) -> None:
        """After every part of load ``job`` has run (on the last part's thread): nothing here."""


def split_job(job: TransferJob, fewest: int, most: int) -> list[TransferJob]:
    """``job`` as consecutive parts of at least ``fewest`` chunks (sizes differing by at most
    one), at most ``most`` of them; ``[job]`` itself when ``fewest`` is 0 or it is too small."""
    count = min(most, len(job.keys) // fewest) if fewest > 0 else 1
    if count <= 1:
        return [job]
    size, extra = divmod(len(job.keys), count)
    bounds = [i * size + min(i, extra) for i in range(count + 1)]
    return [_slice(job, start, stop) for start, stop in itertools.pairwise(bounds)]


def _slice(job: TransferJob, start: int, stop: int) -> TransferJob:
    links = job.links[start:stop]
    return TransferJob(job.job_id, job.keys[start:stop], job.slots[start:stop], links)
