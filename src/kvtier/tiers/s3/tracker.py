"""How the object tier's per-key requests add up to job results (``JobTracker``).

A job fans out one request per key on the I/O pool; each ends in an ``Outcome`` and the last to
finish reports the job (with ``job_result``'s granularity: a store is all or nothing, a load
names every key that arrived intact, and which failed keys were found but failed verification).

Thread safety: ``record`` may be called from any thread; one lock per tracker.
"""

from __future__ import annotations

import enum
import threading

from kvtier.keys import ChunkKey
from kvtier.tiers.base import JobResult, Op, TransferJob, job_result


class Outcome(enum.Enum):
    """How one key of a job ended."""

    OK = "ok"
    FAILED = "failed"
    CORRUPT = "corrupt"  # found, but failed verification


class JobTracker:
    """Counts down the keys of one job; the last ``record`` returns the job's result."""

    def __init__(self, job: TransferJob, op: Op) -> None:
        self.job, self.op = job, op
        self._remaining = len(job.keys)
        self._ended: dict[Outcome, list[ChunkKey]] = {outcome: [] for outcome in Outcome}
        self.written: dict[ChunkKey, int] = {}  # objects put, and their sizes
        self._lock = threading.Lock()

    def wrote(self, key: ChunkKey, nbytes: int) -> None:
        """Object ``key`` of ``nbytes`` was put (whatever the job's result)."""
        with self._lock:
            self.written[key] = nbytes

    def record(self, key: ChunkKey, outcome: Outcome) -> JobResult | None:
        with self._lock:
            self._ended[outcome].append(key)
            self._remaining -= 1
            if self._remaining:
                return None
        corrupt = self._ended[Outcome.CORRUPT]
        ok = set(self._ended[Outcome.OK]).difference(self._ended[Outcome.FAILED], corrupt)
        return job_result(self.job, self.op, ok, None, corrupt)
