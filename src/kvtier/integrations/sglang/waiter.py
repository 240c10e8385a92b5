"""JobWaiter: runtime jobs whose SGLang caller blocks until they report.

SGLang calls ``batch_get_v1`` and ``batch_set_v1`` on its own I/O threads and expects the
pages moved when the call returns. kvtier's tiers never block: a job is submitted to the
runtime's ``TierSet`` and reports later. ``run`` submits a caller's jobs, each with an owner
token of its own, then polls every tier (through ``Runtime.poll_tier``: the SLO guard sees each
finished load) until all of that caller's jobs have reported. Whoever polls routes every
finished job to its owner, so two threads waiting at once each get exactly their own. Keys a
tier removed are handed to ``on_removed`` (KV events).

A job is waited for until it reports, never abandoned: a load writes into SGLang's host pages,
which must not be reused while a tier may still write them. Tiers report every job (the tier
contract), failed and timed-out ones too.

Thread safety: everything runs under the runtime's lock, released while waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kvtier.core.runtime import Runtime
from kvtier.core.tier_set import Finished
from kvtier.keys import ChunkKey
from kvtier.tiers.base import Op

#: How long a waiting caller sleeps between polls (tiers do not wake it).
POLL_S = 0.002


@dataclass(frozen=True)
class Job:
    """One job for tier ``tier``: move ``keys`` to or from ``slots``."""

    tier: int
    op: Op
    keys: list[ChunkKey]
    slots: list[int]


class _Owner:
    """A job's owner token (identity-hashed)."""

    __slots__ = ()


class JobWaiter:
    """Submits jobs and blocks until each reports (see the module docstring)."""

    def __init__(self, runtime: Runtime, on_removed: Callable[[int, list[ChunkKey]], None]) -> None:
        self._runtime = runtime
        self._on_removed = on_removed
        self._done: dict[_Owner, Finished] = {}

    def run(self, jobs: list[Job]) -> list[Finished]:
        """Each job's ``Finished``, in order, once every one has reported. Call it without
        holding the runtime's lock (it is released while waiting)."""
        owners = [_Owner() for _ in jobs]
        with self._runtime.lock:
            for owner, job in zip(owners, jobs, strict=True):
                refused = self._runtime.tiers.submit(job.tier, job.op, job.keys, job.slots, owner)
                if refused is not None:
                    self._done[owner] = refused
            while not all(owner in self._done for owner in owners):
                self.poll()
                if not all(owner in self._done for owner in owners):
                    self._runtime.lock.release()  # let the other threads in while we sleep
                    try:
                        time.sleep(POLL_S)
                    finally:
                        self._runtime.lock.acquire()
            return [self._done.pop(owner) for owner in owners]

    def poll(self) -> None:
        """Route every tier's finished jobs to their owners (under the runtime's lock)."""
        with self._runtime.lock:
            for index in range(len(self._runtime.tiers)):
                finished, removed = self._runtime.poll_tier(index)
                for job in finished:
                    if isinstance(job.job.owner, _Owner):
                        self._done[job.job.owner] = job
                if removed:
                    self._on_removed(index, removed)
