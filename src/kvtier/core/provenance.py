"""Provenance: where each chunk came from and why a lookup missed, in one place.

It remembers, boundedly, the chunks evicted from host memory, the (tier, chunk) promotions that
failed (so a failed tier is not asked again until the chunk is stored anew: no livelock), and the
tier each promoted chunk came from until the engine loads it. From these it names the reason of
a miss (``MISS_REASONS``) and the source of each loaded chunk, and it counts recomputed chunks
and prompt tokens by those names.

Thread safety: none; it belongs to the manager (called under its lock).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence, Sized
from typing import Literal

from kvtier.errors import InvalidArgumentError, shown
from kvtier.keys import ChunkKey
from kvtier.telemetry.metrics import ManagerMetrics

#: How many promotion failures, evictions and promotion sources are remembered.
MEMORY = 1 << 16

Failure = Literal["integrity", "io"]


class Bounded(OrderedDict[tuple[int, ChunkKey] | ChunkKey, str]):
    """An insertion-ordered map that forgets its oldest entries beyond ``MEMORY``."""

    def remember(self, key: tuple[int, ChunkKey] | ChunkKey, value: str) -> None:
        self[key] = value
        while len(self) > MEMORY:
            self.popitem(last=False)


class Provenance:
    """Evictions, failed promotions, promotion sources, and the miss and source counters."""

    def __init__(self, metrics: ManagerMetrics, tiers: Sized, tokens_per_chunk: int) -> None:
        self._metrics, self._tokens_per_chunk = metrics, tokens_per_chunk
        self._tiers = tiers  # only its length: tier indexes name the (tier, key) failures
        self._evicted = Bounded()  # key -> ""
        self._failed = Bounded()  # (tier, key) -> "integrity" | "io"
        self._promoted_from = Bounded()  # key -> tier name, until the chunk is loaded
        self._not_admitted = Bounded()  # key -> "": dropped by admission at every level

    # -- what happened -----------------------------------------------------------------------
    def evicted(self, keys: Iterable[ChunkKey]) -> None:
        for key in keys:
            self._evicted.remember(key, "")

    def promoted(self, keys: Iterable[ChunkKey], tier_name: str) -> None:
        for key in keys:
            self._promoted_from.remember(key, tier_name)

    def not_admitted(self, keys: Iterable[ChunkKey]) -> None:
        for key in keys:
            self._not_admitted.remember(key, "")

    def admitted(self, keys: Iterable[ChunkKey]) -> None:
        if self._not_admitted:
            for key in keys:
                self._not_admitted.pop(key, None)

    def failed(self, tier: int, key: ChunkKey, reason: Failure) -> None:
        self._failed.remember((tier, key), reason)

    def stored(self, keys: Iterable[ChunkKey]) -> None:
        """Keys stored anew: every tier may be asked for them again."""
        if not self._failed:
            return
        for key in keys:
            for tier in range(len(self._tiers)):
                self._failed.pop((tier, key), None)

    # -- what it means -----------------------------------------------------------------------
    def has_failed(self, tier: int, key: ChunkKey) -> bool:
        return (tier, key) in self._failed

    def miss_reason(self, key: ChunkKey, absent: str | None) -> str:
        """Why ``key``, held by no tier, must be recomputed (one of ``MISS_REASONS``)."""
        failures = {self._failed.get((tier, key)) for tier in range(len(self._tiers))}
        if "integrity" in failures:
            return "integrity_failure"
        if "io" in failures:
            return "promotion_failed"
        if absent is not None:  # a tier that was down or switched off might have held it
            return absent
        if key in self._not_admitted:
            return "not_admitted"
        return "evicted" if key in self._evicted else "never_stored"

    def count_loaded(self, keys: Sequence[ChunkKey], into: Counter[str] | None = None) -> None:
        """Prompt tokens of chunks the engine loads, by source: ``host`` or the tier's name;
        the chunks are also counted ``into`` that Counter (else ``InvalidArgumentError``,
        nothing counted)."""
        if into is not None and not isinstance(into, Counter):
            raise InvalidArgumentError(
                f"prepare_load: sources must be a Counter, not {shown(into)}"
            )
        if not self._promoted_from:  # the common case: every chunk was in host already
            sources = Counter({"host": len(keys)})
        else:
            sources = Counter(self._promoted_from.pop(key, "host") for key in keys)
        for source, chunks in sources.items():
            self._count_tokens(chunks, source)
        if into is not None:
            into.update(sources)

    def count_recomputed(self, num_chunks: int, reason: str | None) -> None:
        """``num_chunks`` of a lookup will be recomputed; ``reason`` is ``None`` when unknown."""
        self._count_tokens(num_chunks, "recomputed")
        if num_chunks and reason is not None:
            self._metrics.count("recomputed_chunks", num_chunks, reason=reason)

    def count_accelerator_hits(self, num_chunks: int) -> None:
        self._count_tokens(num_chunks, "accelerator")

    def _count_tokens(self, num_chunks: int, source: str) -> None:
        tokens = num_chunks * self._tokens_per_chunk
        self._metrics.count("prompt_tokens", tokens, source=source)
