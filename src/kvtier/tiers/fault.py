"""FaultInjectingTier: wraps a real tier and fails chosen keys or operations.

Shipped beside the real tiers so every failure path is tested against the code users run.
Faults: fail every store (the job never reaches the inner tier), fail every load, fail the loads
of chosen keys (reported as failed although the inner tier read them), delay each job's result,
or raise inside ``submit_*`` and ``lookup``.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, ClassVar

from kvtier.config.checks import MAX_LABEL_CHARS, HexKey, Seconds, TierName, check_fields
from kvtier.errors import TierError
from kvtier.keys import ChunkKey
from kvtier.tiers.base import JobResult, Lookup, SecondaryTier, TierConfig, TransferJob


def default_name(inner: str) -> str:
    """``fault(<inner>)``; where the whole would not be a ``Label`` (an inner tier named with
    the most characters allowed), the inner name is cut and ends in ``~`` and 8 hex digits of
    its hash, so two inner names that start alike still give two names."""
    whole = f"fault({inner})"
    if len(whole) <= MAX_LABEL_CHARS:
        return whole
    digest = hashlib.sha256(inner.encode()).hexdigest()[:8]
    return f"fault({inner[: MAX_LABEL_CHARS - len('fault(~)') - 8]}~{digest})"


@dataclass(frozen=True)
class FaultTierConfig:
    """``type: "fault"``: wraps ``inner`` and injects failures (for tests and drills)."""

    type_name: ClassVar[str] = "fault"
    inner: TierConfig
    fail_store: bool = False
    fail_load: bool = False
    fail_keys: tuple[Annotated[str, HexKey()], ...] = ()
    delay_s: Seconds = 0.0
    raise_in_submit: bool = False
    raise_in_lookup: bool = False
    name: TierName | None = None

    def __post_init__(self) -> None:
        check_fields(self)


class FaultInjectingTier(SecondaryTier):
    """Wraps ``inner``; the fault settings are plain attributes, changeable at any time."""

    def __init__(
        self,
        inner: SecondaryTier,
        *,
        fail_store: bool = False,
        fail_load: bool = False,
        fail_keys: Iterable[ChunkKey] = (),
        delay_s: float = 0.0,
        raise_in_submit: bool = False,
        raise_in_lookup: bool = False,
        name: str | None = None,
    ) -> None:
        self.inner = inner
        self.name = name or default_name(inner.name)
        self.fail_store, self.fail_load = fail_store, fail_load
        self.fail_keys: set[ChunkKey] = set(fail_keys)
        self.delay_s = delay_s
        self.raise_in_submit, self.raise_in_lookup = raise_in_submit, raise_in_lookup
        self.calls: dict[str, int] = {"lookup": 0, "store": 0, "load": 0}
        self._delayed: list[tuple[float, JobResult]] = []
        self._lock = threading.Lock()

    @property
    def accepts_stores(self) -> bool:
        return self.inner.accepts_stores

    def lookup(self, key: ChunkKey) -> Lookup:
        self.calls["lookup"] += 1
        if self.raise_in_lookup:
            raise TierError("injected lookup fault")
        return self.inner.lookup(key)

    def submit_store(self, job: TransferJob) -> None:
        self._submit("store", job)
        if self.fail_store:
            failed = JobResult(job.job_id, "store", frozenset(), frozenset(job.keys), "injected")
            with self._lock:
                self._delayed.append((time.monotonic() + self.delay_s, failed))
            return
        self.inner.submit_store(job)

    def submit_load(self, job: TransferJob) -> None:
        self._submit("load", job)
        self.inner.submit_load(job)

    def _submit(self, op: str, job: TransferJob) -> None:
        self.calls[op] += 1
        if self.raise_in_submit:
            raise TierError(f"injected {op} submit fault")

    def get_finished_jobs(self) -> list[JobResult]:
        now = time.monotonic()
        with self._lock:
            for result in self.inner.get_finished_jobs():
                self._delayed.append((now + self.delay_s, self._inject(result)))
            ready = [r for t, r in self._delayed if t <= now]
            self._delayed = [(t, r) for t, r in self._delayed if t > now]
        return ready

    def _inject(self, result: JobResult) -> JobResult:
        if result.op == "store":
            return result
        bad = result.succeeded if self.fail_load else result.succeeded & self.fail_keys
        if not bad:
            return result
        return JobResult(
            result.job_id, result.op, result.succeeded - bad, result.failed | bad, "injected fault"
        )

    def close(self) -> None:
        self.inner.close()

    def stats(self) -> dict[str, int]:
        return self.inner.stats()
