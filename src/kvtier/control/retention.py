"""HostRetention: what each level keeps (admission) and for how long (priority), for the manager.

The manager asks it three things: which offered chunks host memory keeps (``plan_store``, then
``reserved`` once their slots are taken), which stored chunks each secondary tier gets
(``for_tiers``), and to note chunks the engine used (``used``, ``retain``). Chunks kept nowhere
are remembered by ``Provenance`` so that their later miss is counted as ``not_admitted``.

Priorities follow TensorRT-LLM's retention config: 0-100 (``DEFAULT_PRIORITY`` when not given),
optionally for ``duration_s`` seconds, after which the chunk drops back to the default.

Thread safety: none; the manager calls it under its lock.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Sequence
from typing import TypeGuard

from kvtier.control.admission import Offer
from kvtier.control.admission.gate import HOST, Admission
from kvtier.core.host_slots import HostTier
from kvtier.core.provenance import Provenance
from kvtier.errors import InvalidArgumentError
from kvtier.keys import ChunkKey
from kvtier.policies.priority import DEFAULT_PRIORITY, checked_priority

Priority = int | Sequence[int] | None


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
        raise InvalidArgumentError(f"priority: expected 0 to 100 or a list, got {priority!r}")
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


def expiry(duration_s: float | None) -> float | None:
    """When a priority given for ``duration_s`` seconds ends (monotonic clock)."""
    if duration_s is None:
        return None
    number = isinstance(duration_s, numbers.Real) and not isinstance(duration_s, bool)
    if not (number and math.isfinite(duration_s) and duration_s > 0):
        raise InvalidArgumentError(f"duration_s: expected a finite number > 0, got {duration_s}")
    return time.monotonic() + duration_s


def prefix_length(first_chunk: int, keys: Sequence[ChunkKey]) -> int:
    """The length in chunks of a prefix whose chunks from ``first_chunk`` (>= 0) are ``keys``."""
    if not _is_integer(first_chunk) or first_chunk < 0:
        raise InvalidArgumentError(f"first_chunk: expected an integer >= 0, got {first_chunk!r}")
    return int(first_chunk) + len(keys)


def _is_integer(value: object) -> TypeGuard[int]:
    """An int, or any other integral number (``numpy.int64``), but never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class HostRetention:
    """Admission and priority decisions over one manager's host tier."""

    def __init__(self, host: HostTier, admission: Admission, provenance: Provenance) -> None:
        self._host, self._admission, self._provenance = host, admission, provenance
        self._offer: Offer | None = None

    def plan_store(
        self, new: list[ChunkKey], prefix_chunks: int, wanted: list[int]
    ) -> list[ChunkKey]:
        """Which of the ``new`` chunks offered (with priorities ``wanted``) host memory keeps;
        ``prefix_chunks``: the length of their request's prefix, chunks already in host too."""
        self._admission.seen(new)
        if not self._admission.active:
            return new
        self._offer = self._admission.offer(new, prefix_chunks, wanted)
        kept = self._admission.admit(HOST, self._offer)
        self._provenance.admitted(kept)
        if len(kept) < len(new):
            self._provenance.not_admitted(set(new) - set(kept))
        return kept

    def reserved(self, kept: list[ChunkKey], wanted: Sequence[int], until: float | None) -> None:
        """Slots were reserved for ``kept`` (a subset of the keys ``wanted`` is aligned with)."""
        if self._offer is not None:
            self._admission.remember(self._offer, kept)
            self._offer = None
        self.retain_each(kept, wanted, until)

    def retain_each(
        self, keys: Sequence[ChunkKey], wanted: Sequence[int], until: float | None
    ) -> None:
        """Set each key's priority (skipped when all are the default for good)."""
        if until is None and all(p == DEFAULT_PRIORITY for p in wanted):
            return
        for key, priority in zip(keys, wanted, strict=False):
            self._host.set_priority((key,), priority, until)

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
