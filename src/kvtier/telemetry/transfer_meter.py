"""TransferMeter: accelerator <-> host copy throughput, from ``prepare_*`` to ``complete_*``.

Thread safety: none; it belongs to the manager (called under its lock).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from itertools import repeat

from kvtier.telemetry.metrics import ManagerMetrics


class TransferMeter:
    """Accelerator <-> host copy throughput: when each chunk's copy started, until it ends."""

    def __init__(self, metrics: ManagerMetrics, chunk_bytes: int) -> None:
        self._metrics, self._chunk_bytes = metrics, chunk_bytes
        self._started: dict[Hashable, float] = {}

    def start(self, keys: Sequence[Hashable]) -> None:
        self._started.update(dict.fromkeys(keys, time.monotonic()))

    def stop(self, direction: str, keys: Sequence[Hashable]) -> None:
        """Count the copies of ``keys`` that were started; the time since the earliest start."""
        starts = [t for t in map(self._started.pop, keys, repeat(None)) if t is not None]
        if starts:
            seconds = time.monotonic() - min(starts)
            self._metrics.transfer(direction, len(starts) * self._chunk_bytes, seconds)
