"""Running a tier's jobs: plain functions on separate read and write thread pools.

``JobRunner`` runs job functions and collects their ``JobResult``s (a store succeeds or fails as
a whole; a load reports each key); ``PooledTier`` is a tier whose ``submit_*`` and
``get_finished_jobs`` are exactly that; ``drain`` empties a result queue without waiting.

Thread safety: ``JobRunner.submit`` and ``finished`` may be called from any thread; the job
functions run on the pools' threads.
"""

from __future__ import annotations

import logging
import queue
import threading
from abc import abstractmethod
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from kvtier.keys import ChunkKey
from kvtier.telemetry.logs import ThrottledLog
from kvtier.tiers.base import JobOutcome, JobResult, Op, SecondaryTier, TransferJob, job_result

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


class JobRunner:
    """Runs job functions on separate read and write thread pools; collects their results.

    A job function returns the keys that succeeded (or a ``JobOutcome``); an exception fails
    every key of the job. ``on_result`` is called on the pool's thread after each result is
    queued. Thread safety: ``submit`` and ``finished`` may be called from any thread.
    """

    on_result: Callable[[], None] = staticmethod(lambda: None)

    def __init__(self, name: str, n_read_threads: int, n_write_threads: int) -> None:
        self._readers = ThreadPoolExecutor(n_read_threads, thread_name_prefix=f"{name}-read")
        self._writers = ThreadPoolExecutor(n_write_threads, thread_name_prefix=f"{name}-write")
        self._results: queue.SimpleQueue[JobResult] = queue.SimpleQueue()
        self._closed = threading.Event()

    def submit(self, op: Op, job: TransferJob, fn: JobFunction) -> None:
        if self._closed.is_set():
            self._results.put(self._result(op, job, JobOutcome(()), "tier is closed"))
            return
        pool = self._readers if op == "load" else self._writers
        pool.submit(self._run, op, job, fn)

    def _run(self, op: Op, job: TransferJob, fn: JobFunction) -> None:
        try:
            outcome, error = fn(), None
        except Exception as exc:  # a worker must report, never die silently
            warn.warning(f"{op}:{type(exc).__name__}", "%s job %d failed: %s", op, job.job_id, exc)
            outcome, error = (), f"{type(exc).__name__}: {exc}"
        if not isinstance(outcome, JobOutcome):
            outcome = JobOutcome(outcome)
        self._results.put(self._result(op, job, outcome, error))
        self.on_result()

    @staticmethod
    def _result(op: Op, job: TransferJob, outcome: JobOutcome, error: str | None) -> JobResult:
        return job_result(job, op, outcome.succeeded, error, outcome.integrity_failed)

    def finished(self) -> list[JobResult]:
        return drain(self._results)

    def close(self, cancel: bool = False) -> None:
        """Stop accepting jobs; finish (or cancel queued) jobs and join the threads."""
        self._closed.set()
        self._readers.shutdown(wait=True, cancel_futures=cancel)
        self._writers.shutdown(wait=True, cancel_futures=cancel)


class PooledTier(SecondaryTier):
    """A tier whose jobs are plain functions run on a ``JobRunner``'s read and write pools.

    Subclasses set ``self._runner`` and implement ``_store(job)`` and ``_load(job)``, each
    returning the keys that succeeded (or a ``JobOutcome``); ``close`` must close the runner.
    Every job result signals progress; a subclass whose ``lookup`` can answer ``RETRY`` must
    call ``notify_progress`` when that answer may change (or set ``signals_progress`` False).
    """

    _runner: JobRunner
    signals_progress = True

    def bind_progress(self, notify: Callable[[], None]) -> None:
        super().bind_progress(notify)
        self._runner.on_result = notify

    def submit_store(self, job: TransferJob) -> None:
        self._runner.submit("store", job, lambda: self._store(job))

    def submit_load(self, job: TransferJob) -> None:
        self._runner.submit("load", job, lambda: self._load(job))

    def get_finished_jobs(self) -> list[JobResult]:
        return self._runner.finished()

    @abstractmethod
    def _store(self, job: TransferJob) -> Iterable[ChunkKey] | JobOutcome: ...

    @abstractmethod
    def _load(self, job: TransferJob) -> Iterable[ChunkKey] | JobOutcome: ...
