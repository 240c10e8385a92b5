"""Answers: what a remote tier has learned about which keys it holds, for non-blocking lookups.

Remembered hits (bounded, least recently used forgotten first; optionally expiring after
``hit_ttl_s``, and optionally naming the *holder*, e.g. the peer that answered), misses that
expire after ``miss_ttl_s`` (another instance may store the chunk meanwhile; ``RecentMisses``:
each is told at least once), and keys whose probe is under way. ``answer`` says HIT, MISS or
RETRY from what is known, or ``None`` when nothing is: the key is then marked as probing and
the caller must start a probe that ends in ``probed`` (or ``found`` or ``missing``). A probe's
answer is as old as the probe: ``probed`` drops it when ``found`` or ``missing`` told something
about the key meanwhile (a store, an eviction), which is newer. At most ``MAX_PROBING``
keys are probed at once (``ProbesInFlight``): past that a new key is a ``MISS``.

Thread safety: every method may be called from any thread; one lock guards all state.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict

from kvtier.keys import ChunkKey
from kvtier.tiers.base import HIT, MISS, Lookup
from kvtier.tiers.shared.misses import RecentMisses
from kvtier.tiers.shared.probes_in_flight import ProbesInFlight

MAX_HITS = 1 << 18


class Answers:
    """Hits (with expiry and holder), expiring misses, and probes in flight."""

    def __init__(
        self, miss_ttl_s: float, hit_ttl_s: float | None = None, max_hits: int = MAX_HITS
    ) -> None:
        self._max_hits = max_hits
        self._hit_ttl = math.inf if hit_ttl_s is None else hit_ttl_s
        self._hits: OrderedDict[ChunkKey, tuple[float, str]] = OrderedDict()  # LRU order
        self._misses = RecentMisses(miss_ttl_s)
        self._probing = ProbesInFlight()
        self._lock = threading.Lock()

    def answer(self, key: ChunkKey) -> Lookup | None:
        """What is known about ``key``; ``None`` means unknown and now marked as probing."""
        now = time.monotonic()
        with self._lock:
            if self._fresh_hit(key, now) is not None:
                self._hits.move_to_end(key)
                return HIT
            if key in self._misses:
                return MISS
            return self._probing.claim(key)

    def _fresh_hit(self, key: ChunkKey, now: float) -> str | None:
        expiry, holder = self._hits.get(key, (0.0, ""))
        return holder if expiry > now else None

    def is_hit(self, key: ChunkKey) -> bool:
        with self._lock:
            return self._fresh_hit(key, time.monotonic()) is not None

    def holder(self, key: ChunkKey) -> str | None:
        """Who answered the fresh hit for ``key`` (``""`` when nobody was named), else ``None``."""
        with self._lock:
            return self._fresh_hit(key, time.monotonic())

    def found(self, key: ChunkKey, holder: str = "") -> None:
        with self._lock:
            self._probing.done(key)
            self._hit(key, holder)

    def probed(self, key: ChunkKey, found: bool, holder: str = "") -> bool:
        """The end of the probe ``answer`` started for ``key``: recorded as ``found`` or
        ``missing``, unless either was called for ``key`` since (then this answer is older than
        what is known: dropped). Whether it was recorded."""
        with self._lock:
            if not self._probing.done(key):
                return False
            if found:
                self._hit(key, holder)
            else:
                self._miss(key)
            return True

    def missing(self, key: ChunkKey) -> None:
        """``key`` is not there (or could not be read): a miss until the answer expires."""
        with self._lock:
            self._probing.done(key)
            self._miss(key)

    def _hit(self, key: ChunkKey, holder: str) -> None:
        self._misses.discard(key)
        self._hits.pop(key, None)
        self._hits[key] = (time.monotonic() + self._hit_ttl, holder)
        while len(self._hits) > self._max_hits:
            self._hits.popitem(last=False)

    def _miss(self, key: ChunkKey) -> None:
        self._hits.pop(key, None)
        self._misses.add(key)

    def forget_holder(self, holder: str) -> None:
        """Drop every hit ``holder`` answered (it went away and may have lost them)."""
        with self._lock:
            for key in [k for k, (_, h) in self._hits.items() if h == holder]:
                del self._hits[key]

    def clear(self) -> None:
        """Forget hits and misses (the store may have changed while unreachable)."""
        with self._lock:
            self._hits.clear()
            self._misses.clear()

    def sizes(self) -> dict[str, int]:
        with self._lock:
            return {
                "remembered_hits": len(self._hits),
                "remembered_misses": len(self._misses),
                "probes_in_flight": len(self._probing),
                "probes_skipped_backlog": self._probing.skipped,
            }
