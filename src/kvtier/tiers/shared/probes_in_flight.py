"""ProbesInFlight: the keys a tier is probing (asking its medium whether it holds them), bounded.

A lookup of a key a tier knows nothing about starts a probe (a ``stat``, a ``HEAD``, a question
to peers) and answers ``RETRY`` until it ends. When the medium hangs, probes never end while
every new request brings keys to probe: without a bound, the keys waiting (and the queued work)
would grow with every request. So at most ``limit`` keys are probed at once; past that a lookup
is a miss at once (a recompute, counted in ``skipped``), never more memory.

Thread safety: none; its owner calls it under its own lock.
"""

from __future__ import annotations

from kvtier.keys import ChunkKey
from kvtier.tiers.base import MISS, RETRY, Lookup

#: Keys probed at once, at most, per tier.
MAX_PROBING = 1024


class ProbesInFlight:
    """Keys under probe, at most ``limit``; ``skipped`` counts the lookups refused for room."""

    def __init__(self, limit: int = MAX_PROBING) -> None:
        self._keys: set[ChunkKey] = set()
        self._limit = limit
        self.skipped = 0

    def claim(self, key: ChunkKey) -> Lookup | None:
        """``None``: ``key`` is now under probe (the caller starts it, and calls ``done``);
        ``RETRY`` when it already is; ``MISS`` when ``limit`` keys are (counted)."""
        if key in self._keys:
            return RETRY
        if len(self._keys) >= self._limit:
            self.skipped += 1
            return MISS
        self._keys.add(key)
        return None

    def done(self, key: ChunkKey) -> bool:
        """``key``'s probe ended (whatever it found); whether it was under probe."""
        if key not in self._keys:
            return False
        self._keys.discard(key)
        return True

    def __len__(self) -> int:
        return len(self._keys)
