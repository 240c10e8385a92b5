"""HostRetention: what each level keeps (admission) and for how long (priority), for the manager.

The manager asks it three things: which offered chunks host memory keeps (``plan_store``, then
``reserved`` once their slots are taken), which stored chunks each secondary tier gets
(``for_tiers``), and to note chunks the engine used (``used``, ``retain``). Chunks kept nowhere
are remembered by ``Provenance`` so that their later miss is counted as ``not_admitted``.

Priorities follow TensorRT-LLM's retention config: 0-100 (``DEFAULT_PRIORITY`` when not given),
optionally for ``duration_s`` seconds, after which the chunk drops back to the default.

A call's retention is a request's unless the caller says it is the operator's (``asked``). A
request's is cut to the operator's caps (``max_request_priority``, ``max_request_duration_s``:
``RequestLimits``, the same clamp vLLM's requests go through) and counted when cut; the
operator's is not, and no request's retention changes it while it lasts (``OperatorRetention``).

Thread safety: none; the manager calls it under its lock.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

from kvtier.control.admission import Offer
from kvtier.control.admission.gate import HOST, Admission
from kvtier.core.host_slots import HostTier
from kvtier.core.provenance import Provenance
from kvtier.errors import InvalidArgumentError, shown
from kvtier.keys import ChunkKey
from kvtier.policies.priority import (
    DEFAULT_PRIORITY,
    OperatorRetention,
    RequestLimits,
    checked_duration,
    checked_priority,
)

if TYPE_CHECKING:
    from kvtier.core.runtime import Runtime

Priority = int | Sequence[int] | None


@dataclass(frozen=True)
class Asked:
    """A call's retention, checked: one priority per key until ``until`` (``None``: for good);
    ``given``: a priority was given (else the call leaves priorities alone); ``operator``: the
    operator's (never capped), else a request's (within the caps)."""

    priorities: list[int]
    until: float | None
    given: bool
    operator: bool = False

    def by_key(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, int]:
        """Each key's priority (``keys``: those the priorities were asked for)."""
        return dict(zip(keys, self.priorities, strict=True))


def priorities(keys: Sequence[ChunkKey], priority: Priority) -> list[int]:
    """One priority per key from ``priority`` (one for all, a sequence of one per key, or the
    default); ``InvalidArgumentError`` for anything else."""
    if priority is None:
        return [DEFAULT_PRIORITY] * len(keys)
    if _is_integer(priority):
        values = [priority] * len(keys)
    elif isinstance(priority, Sequence) and not isinstance(priority, str | bytes):
        values = list(priority)
    else:
        raise InvalidArgumentError(f"priority: expected 0 to 100 or a list, got {shown(priority)}")
    if len(values) != len(keys):
        raise InvalidArgumentError(f"priority: {len(values)} values for {len(keys)} keys")
    return [_checked(value) for value in values]


def request_priority(priority: int | None) -> int | None:
    """One priority for all of a request's chunks (``None``: none given), as an integration's
    argument; ``InvalidArgumentError`` for anything else (a list of them included)."""
    return None if priority is None else _checked(priority)


def _checked(value: object) -> int:
    """``value`` as a priority: an integer from 0 to 100, else ``InvalidArgumentError``."""
    try:
        return checked_priority(value)
    except ValueError as exc:
        raise InvalidArgumentError(f"priority: {exc}") from None


def expiry(duration_s: float | None, now: float | None = None) -> float | None:
    """When a priority given for ``duration_s`` seconds from ``now`` (default: the monotonic
    clock's now) ends; ``InvalidArgumentError`` unless a finite number > 0 (of any size)."""
    if duration_s is None:
        return None
    return (time.monotonic() if now is None else now) + _seconds(duration_s)


def _seconds(duration_s: object) -> float:
    try:
        return checked_duration(duration_s)
    except ValueError as exc:
        raise InvalidArgumentError(f"duration_s: {exc}") from None


def limits_of(runtime: Runtime) -> RequestLimits:
    """The operator's caps on a request's retention, from ``runtime``'s configuration."""
    config = runtime.config
    return RequestLimits(config.max_request_priority, config.max_request_duration_s)


def prefix_length(first_chunk: int, keys: Sequence[ChunkKey]) -> int:
    """The length in chunks of a prefix whose chunks from ``first_chunk`` (>= 0) are ``keys``."""
    if not _is_integer(first_chunk) or first_chunk < 0:
        raise InvalidArgumentError(
            f"first_chunk: expected an integer >= 0, got {shown(first_chunk)}"
        )
    return int(first_chunk) + len(keys)


def _is_integer(value: object) -> TypeGuard[int]:
    """An int, or any other integral number (``numpy.int64``), but never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class HostRetention:
    """Admission and priority decisions over one manager's host tier."""

    def __init__(
        self,
        host: HostTier,
        admission: Admission,
        provenance: Provenance,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._host, self._admission, self._provenance = host, admission, provenance
        self._offer: Offer | None = None
        self._clock = clock
        self._operator: OperatorRetention[ChunkKey] = OperatorRetention()

    def asked(
        self,
        keys: Sequence[ChunkKey],
        priority: Priority,
        duration_s: float | None,
        operator: bool,
        runtime: Runtime,
    ) -> Asked:
        """The retention a call gives ``keys`` (``InvalidArgumentError`` if malformed): the
        operator's as given; a request's within ``runtime``'s caps, and counted when cut
        (``kvtier_retention_ignored_total{reason="capped"}``)."""
        wanted = priorities(keys, priority)
        seconds = None if duration_s is None else _seconds(duration_s)
        if priority is not None and not operator:
            clamped = [limits_of(runtime).clamp(p, seconds) for p in wanted]
            ends = [end for _, end in clamped if end is not None]
            capped = [p for p, _ in clamped], min(ends, default=None)
            if capped != (wanted, seconds):
                runtime.metrics.count("retention_ignored", reason="capped")
            wanted, seconds = capped
        until = expiry(seconds, self._clock())
        return Asked(wanted, until, priority is not None, operator)

    def plan_store(
        self, new: list[ChunkKey], prefix_chunks: int, wanted: list[int]
    ) -> list[ChunkKey]:
        """Which of the ``new`` chunks offered (with priorities ``wanted``) host memory keeps;
        ``prefix_chunks``: the length of their request's prefix, chunks already in host too."""
        if self._operator:  # stored anew: what the operator gave an earlier copy is over
            for key in new:
                self._operator.lift(key)
        self._admission.seen(new)
        if not self._admission.active:
            return new
        self._offer = self._admission.offer(new, prefix_chunks, wanted)
        kept = self._admission.admit(HOST, self._offer)
        self._provenance.admitted(kept)
        if len(kept) < len(new):
            self._provenance.not_admitted(set(new) - set(kept))
        return kept

    def reserved(self, kept: list[ChunkKey], wanted: Sequence[int], asked: Asked) -> None:
        """Slots were reserved for ``kept`` (a subset of the keys ``wanted`` is aligned with)."""
        if self._offer is not None:
            self._admission.remember(self._offer, kept)
            self._offer = None
        default = all(p == DEFAULT_PRIORITY for p in wanted)  # where new chunks start
        if asked.operator or asked.until is not None or not default:
            self.retain_each(kept, wanted, asked)

    def retain_each(self, keys: Sequence[ChunkKey], wanted: Sequence[int], asked: Asked) -> None:
        """Give each key its priority as ``asked``. The operator's retention is recorded (or,
        without a priority, lifted); a request's skips the keys the operator's still holds."""
        now = self._clock()
        for key, priority in zip(keys, wanted, strict=False):
            if asked.operator:
                self._operator_gives(key, priority if asked.given else None, asked.until)
            elif self._operator and self._operator.holds(key, self._host.priority_of(key), now):
                continue
            if asked.given:
                self._host.set_priority((key,), priority, asked.until)

    def _operator_gives(self, key: ChunkKey, priority: int | None, until: float | None) -> None:
        if priority is None:
            self._operator.lift(key)
            return
        self._operator.give(key, priority, until)
        if len(self._operator) > self._host.num_slots:  # bounded: only keys in host count
            self._operator.prune(self._host.__contains__)

    def for_tiers(self, own: list[ChunkKey], names: Sequence[str]) -> list[list[ChunkKey]]:
        """For each tier (by name, in order): the stored chunks it gets."""
        if not self._admission.active:
            return [own] * len(names)
        wanted = [_or_default(self._host.priority_of(key)) for key in own]
        offer = self._admission.stored(own, wanted)
        chosen = [self._admission.admit(name, offer) for name in names]
        kept_somewhere = {key for keys in chosen for key in keys}
        self._provenance.admitted(kept_somewhere)
        if names and len(kept_somewhere) < len(own):
            self._provenance.not_admitted([k for k in own if k not in kept_somewhere])
        return chosen

    def failed(self, keys: Sequence[ChunkKey]) -> None:
        self._admission.forget(keys)

    def used(self, keys: Sequence[ChunkKey]) -> None:
        """The engine used these chunks (loaded from host, or hit in its own cache)."""
        self._admission.seen(keys)


def _or_default(priority: int | None) -> int:
    """``priority``, or the default for a key that has none (0 is a priority, not none)."""
    return DEFAULT_PRIORITY if priority is None else priority
