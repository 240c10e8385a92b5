"""Deadlines on tier operations: how long the engine waits for a promotion, a store or a probe.

Past its deadline an operation is *late*. The engine stops waiting for it: a lookup that
needed it answers a miss (reason ``tier_timeout``) and the chunks are recomputed. Its tier is
*stalled* for that kind of operation: given no new job of that kind and, for promotions and
probes, asked no lookup, until the late job reports. The SLO guard counts each late operation
as over its budget, so a tier that hangs trips the guard just as a slow one does.

A late operation is never abandoned: its host slot stays out of use until the tier reports.
Late bytes therefore land only in the slot reserved for them, and a slot a tier may still be
reading is never handed to another chunk (which would let a late write store that chunk's bytes
under the old key). What a hung tier pins is bounded instead: a stalled tier gets no new jobs,
and write-throughs stop at ``WRITE_THROUGH_SHARE`` of host memory (``write_through``).

Thread safety: none; owned by the manager's ``TierSet`` and ``Promoter`` (under its lock).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from kvtier.config.checks import Timeout, check_fields
from kvtier.keys import ChunkKey

#: The share of host slots write-through jobs may hold at once; past it, chunks are not written
#: through (``kvtier_admission_dropped_total{reason="tier_busy"}``) and the engine keeps the rest.
WRITE_THROUGH_SHARE = 0.5
#: Probes remembered at once; the oldest is forgotten first (it starts its wait anew).
MAX_PROBES = 8192


@dataclass(frozen=True)
class TierDeadlines:
    """``deadlines``: seconds the engine waits for each kind of tier operation."""

    #: A promotion (a tier's load job into host memory).
    promotion_s: Timeout = 5.0
    #: A write-through (a tier's store job out of host memory).
    store_s: Timeout = 30.0
    #: A lookup a tier answers ``RETRY`` to while it finds out (a stat, a peer's answer).
    probe_s: Timeout = 5.0

    def __post_init__(self) -> None:
        check_fields(self)

    def of(self, op: str) -> float:
        """The deadline of a job of kind ``op`` (``load`` or ``store``)."""
        return self.promotion_s if op == "load" else self.store_s


class ProbeAges:
    """When each (tier, key) lookup began answering ``RETRY``; older than ``seconds``: late."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._seconds, self._clock = seconds, clock
        self._since: OrderedDict[tuple[int, ChunkKey], float] = OrderedDict()

    def late(self, index: int, key: ChunkKey) -> bool:
        """Tier ``index`` answered ``RETRY`` for ``key`` again: whether it has for too long."""
        now = self._clock()
        since = self._since.setdefault((index, key), now)
        while len(self._since) > MAX_PROBES:
            self._since.popitem(last=False)
        return now - since > self._seconds

    def settled(self, index: int, key: ChunkKey) -> None:
        """Tier ``index`` answered ``key`` (``HIT`` or ``MISS``): its next ``RETRY`` starts anew."""
        self._since.pop((index, key), None)
