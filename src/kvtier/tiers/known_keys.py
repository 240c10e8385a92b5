"""KnownKeys: what a remote tier has learned about which keys it holds, for non-blocking lookups.

Three sets: remembered hits (bounded; the least recently used are forgotten first), negatives
that expire after ``negative_ttl_s`` (another instance may store the chunk meanwhile), and keys
whose probe is under way. ``answer`` says HIT, MISS or RETRY from what is known, or ``None`` when
nothing is: the key is then marked as probing and the caller must start a probe that ends in
``found`` or ``missing``.

Thread safety: every method may be called from any thread; one lock guards all three sets.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from kvtier.keys import ChunkKey
from kvtier.tiers.base import HIT, MISS, RETRY, Lookup

MAX_HITS = 1 << 18
MAX_NEGATIVES = 1 << 16


class KnownKeys:
    """Hits, expiring negatives and probes in flight (see the module docstring)."""

    def __init__(self, negative_ttl_s: float, max_hits: int = MAX_HITS) -> None:
        self._ttl, self._max_hits = negative_ttl_s, max_hits
        self._hits: OrderedDict[ChunkKey, None] = OrderedDict()
        self._negatives: OrderedDict[ChunkKey, float] = OrderedDict()  # expiry order
        self._probing: set[ChunkKey] = set()
        self._lock = threading.Lock()

    def answer(self, key: ChunkKey) -> Lookup | None:
        """What is known about ``key``; ``None`` means unknown and now marked as probing."""
        with self._lock:
            if key in self._hits:
                self._hits.move_to_end(key)
                return HIT
            expiry = self._negatives.get(key)
            if expiry is not None:
                if expiry > time.monotonic():
                    return MISS
                del self._negatives[key]
            if key in self._probing:
                return RETRY
            self._probing.add(key)
            return None

    def is_hit(self, key: ChunkKey) -> bool:
        with self._lock:
            return key in self._hits

    def found(self, key: ChunkKey) -> None:
        with self._lock:
            self._probing.discard(key)
            self._negatives.pop(key, None)
            self._hits[key] = None
            self._hits.move_to_end(key)
            while len(self._hits) > self._max_hits:
                self._hits.popitem(last=False)

    def missing(self, key: ChunkKey) -> None:
        """``key`` is not there (or could not be read): a miss until the negative expires."""
        now = time.monotonic()
        with self._lock:
            self._probing.discard(key)
            self._hits.pop(key, None)
            self._negatives[key] = now + self._ttl
            self._negatives.move_to_end(key)
            while self._negatives and (
                len(self._negatives) > MAX_NEGATIVES or next(iter(self._negatives.values())) <= now
            ):
                self._negatives.popitem(last=False)

    def clear(self) -> None:
        """Forget hits and negatives (the store may have changed while unreachable)."""
        with self._lock:
            self._hits.clear()
            self._negatives.clear()

    def sizes(self) -> dict[str, int]:
        with self._lock:
            return {
                "remembered_hits": len(self._hits),
                "remembered_misses": len(self._negatives),
                "probes_in_flight": len(self._probing),
            }
