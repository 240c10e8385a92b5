"""FrequencySketch: how often each chunk was seen, approximately, in bounded memory.

A count-min sketch (``depth`` rows of ``width`` saturating 8-bit counters) indexed by slices of
the chunk key itself (keys are uniform sha256 digests, so no extra hashing). An estimate is
never below the true count and over it only through collisions. Every ``decay_every`` recorded
sightings all counters are halved (once per ``decay_every`` even when one call records more), so
old popularity fades (TinyLFU's aging): memory is
``depth * width`` bytes whatever the number of keys. Within one ``record`` call a counter moves
by one at most (vectorised; two keys of one call colliding in every row would count once).

Thread safety: none; the manager calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvtier.keys import ChunkKey

DEPTH = 4
DEFAULT_WIDTH = 1 << 18  # 1 MiB of counters over 4 rows


class FrequencySketch:
    """Approximate sighting counts of chunk keys."""

    def __init__(self, width: int = DEFAULT_WIDTH, decay_every: int | None = None) -> None:
        if width & (width - 1) or width <= 0:
            raise ValueError("width must be a power of two")
        self._mask = np.uint64(width - 1)
        self._counts = np.zeros((DEPTH, width), dtype=np.uint8)
        self._rows = np.arange(DEPTH)[:, None]
        self._offsets = self._rows * width
        self._decay_every = decay_every or 8 * width
        self._since_decay = 0

    def record(self, keys: Sequence[ChunkKey]) -> None:
        """One more sighting of each key (a key listed twice in one call counts once)."""
        if not keys:
            return
        index = (self._index(keys) + self._offsets).ravel()  # flat positions, row by row
        counts = self._counts.reshape(-1)
        seen = counts[index]
        counts[index] = np.where(seen < 255, seen + 1, seen)
        self._since_decay += len(keys)
        halvings, self._since_decay = divmod(self._since_decay, self._decay_every)
        if halvings:  # once per window crossed, even by one call; 8 halvings empty a counter
            self._counts >>= min(halvings, 8)

    def estimate(self, keys: Sequence[ChunkKey]) -> np.ndarray:
        """Estimated sightings of each key (never below the true count since the last decay)."""
        if not keys:
            return np.zeros(0, dtype=np.int64)
        index = self._index(keys)
        counts: np.ndarray = self._counts[self._rows, index].min(axis=0)
        return counts.astype(np.int64)

    def _index(self, keys: Sequence[ChunkKey]) -> np.ndarray:
        words = np.frombuffer(b"".join(keys), dtype=np.uint64).reshape(len(keys), -1)
        return (words[:, :DEPTH].T & self._mask).astype(np.intp)
