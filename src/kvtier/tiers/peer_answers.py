"""PeerAnswers: what the peer tier has learned about which peer holds which key.

Remembered hits name the peer that holds the key and expire after ``hit_ttl_s`` (the peer may
evict the chunk); misses expire after ``miss_ttl_s``. A key asked while neither is known is marked
as probing, and the asker must start a remote lookup that ends in ``hit`` or ``miss``.

Thread safety: every method may be called from any thread; one lock guards all state.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import TypeVar

from kvtier.keys import ChunkKey
from kvtier.tiers.base import HIT, MISS, RETRY, Lookup

MAX_REMEMBERED = 1 << 16
V = TypeVar("V")


class PeerAnswers:
    """Expiring hits (with their holder) and misses, and the set of keys being probed."""

    def __init__(self, hit_ttl_s: float, miss_ttl_s: float) -> None:
        self._hit_ttl, self._miss_ttl = hit_ttl_s, miss_ttl_s
        self._hits: OrderedDict[ChunkKey, tuple[float, str]] = OrderedDict()
        self._misses: OrderedDict[ChunkKey, float] = OrderedDict()
        self._probing: set[ChunkKey] = set()
        self._lock = threading.Lock()

    def answer(self, key: ChunkKey) -> Lookup | None:
        """HIT, MISS or RETRY from what is known; ``None``: unknown, now marked as probing."""
        now = time.monotonic()
        with self._lock:
            if _fresh(self._hits.get(key, (0.0, ""))[0], now):
                return HIT
            if _fresh(self._misses.get(key, 0.0), now):
                return MISS
            if key in self._probing:
                return RETRY
            self._probing.add(key)
            return None

    def holder(self, key: ChunkKey) -> str | None:
        """The peer that last said it holds ``key``, while that answer is fresh."""
        with self._lock:
            expiry, peer = self._hits.get(key, (0.0, ""))
            return peer if _fresh(expiry, time.monotonic()) else None

    def hit(self, key: ChunkKey, peer: str) -> None:
        with self._lock:
            self._probing.discard(key)
            self._misses.pop(key, None)
            _put(self._hits, key, (time.monotonic() + self._hit_ttl, peer))

    def miss(self, key: ChunkKey) -> None:
        with self._lock:
            self._probing.discard(key)
            self._hits.pop(key, None)
            _put(self._misses, key, time.monotonic() + self._miss_ttl)

    def forget_peer(self, peer: str) -> None:
        """Drop every hit that ``peer`` answered (it went away and may have lost them)."""
        with self._lock:
            for key in [k for k, (_, p) in self._hits.items() if p == peer]:
                del self._hits[key]

    def sizes(self) -> dict[str, int]:
        with self._lock:
            return {
                "remembered_hits": len(self._hits),
                "remembered_misses": len(self._misses),
                "probes_in_flight": len(self._probing),
            }


def _fresh(expiry: float, now: float) -> bool:
    return expiry > now


def _put(entries: OrderedDict[ChunkKey, V], key: ChunkKey, value: V) -> None:
    """Insert at the end (entries share one TTL, so the front expires first) and trim."""
    entries.pop(key, None)
    entries[key] = value
    while len(entries) > MAX_REMEMBERED:
        entries.popitem(last=False)
