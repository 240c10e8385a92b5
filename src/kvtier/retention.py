"""Retention: what each level keeps (admission) and for how long (priority), for the manager.

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
import time
from collections.abc import Sequence

from kvtier.admission import Offer
from kvtier.admission.gate import HOST, Admission
from kvtier.errors import InvalidArgumentError
from kvtier.host import HostTier
from kvtier.keys import ChunkKey
from kvtier.policies.priority import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from kvtier.provenance import Provenance

Priority = int | Sequence[int] | None


def priorities(keys: Sequence[ChunkKey], priority: Priority) -> list[int]:
    """One priority per key from ``priority`` (one for all, one per key, or the default)."""
    if priority is None:
        return [DEFAULT_PRIORITY] * len(keys)
    values = [priority] * len(keys) if isinstance(priority, int) else list(priority)
    if len(values) != len(keys):
        raise InvalidArgumentError(f"priority: {len(values)} values for {len(keys)} keys")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgumentError(f"priority: expected an integer, got {value!r}")
        if not MIN_PRIORITY <= value <= MAX_PRIORITY:
            raise InvalidArgumentError(f"priority: expected 0 to 100, got {value}")
    return values


def expiry(duration_s: float | None) -> float | None:
    """When a priority given for ``duration_s`` seconds ends (monotonic clock)."""
    if duration_s is None:
        return None
    if isinstance(duration_s, bool) or not (math.isfinite(duration_s) and duration_s > 0):
        raise InvalidArgumentError(f"duration_s: expected a finite number > 0, got {duration_s}")
    return time.monotonic() + duration_s


class Retention:
    """Admission and priority decisions over one manager's host tier."""

    def __init__(self, host: HostTier, admission: Admission, provenance: Provenance) -> None:
        self._host, self._admission, self._provenance = host, admission, provenance
        self._offer: Offer | None = None

    def plan_store(
        self, new: list[ChunkKey], first_chunk: int, wanted: list[int]
    ) -> list[ChunkKey]:
        """Which of the ``new`` chunks offered (with priorities ``wanted``) host memory keeps."""
        self._admission.seen(new)
        if not self._admission.active:
            return new
        self._offer = self._admission.offer(new, first_chunk, wanted)
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
        wanted = [self._host.priority_of(key) or DEFAULT_PRIORITY for key in own]
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
