"""Every number of retention and admission under vLLM, on both sides and at itself.

The vLLM-free parts the adapter runs: a tier's admission as the adapter drives the engine's
runtime (``note_offer``, then the gate), a request's ``kvtier_retention`` (the priority range,
durations, ranges and their cap) and ``PriorityCache``'s expiries. The same rules through the
manager: ``tests/control/test_admission_bounds.py`` and ``tests/policies/
test_priority_bounds.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvtier.config import RuntimeConfig
from kvtier.core.runtime import Runtime
from kvtier.core.tier_set import Retired
from kvtier.errors import InvalidArgumentError
from kvtier.integrations.vllm import request_retention as retentions
from kvtier.integrations.vllm.options import admission_config
from kvtier.integrations.vllm.priority_cache import PriorityCache
from kvtier.integrations.vllm.request_retention import (
    MAX_RANGES,
    RETENTION_KEY,
    Retention,
    is_capped,
    is_invalid,
    parse_retention,
    request_retention,
    retention_by_key,
)
from kvtier.keys import ChunkKey
from kvtier.policies.priority import DEFAULT_PRIORITY, RequestLimits
from tests.integrations.vllm.test_retention import Clock, Context

TIER = "KvtierFs"


class Gate:
    """The engine runtime's admission for one vLLM tier, driven as the adapter drives it."""

    def __init__(self, entry: Any, min_priority: int | None = None) -> None:
        self.runtime = Runtime(RuntimeConfig(), 4096)
        self.runtime.add_tier(Retired(TIER), admission_config(entry, TIER), min_priority)
        self.runtime.bind()

    def offer(
        self, chunks: list[ChunkKey], prefix: int | None = None, priorities: Any = None
    ) -> list[ChunkKey]:
        """One store offered to the tier (a sighting of each chunk); the chunks it keeps."""
        self.runtime.note_offer(chunks)
        wanted = priorities or [DEFAULT_PRIORITY] * len(chunks)
        length = len(chunks) if prefix is None else prefix
        offer = self.runtime.admission.offer(chunks, length, wanted)
        return self.runtime.admission.admit(TIER, offer)


def keys(n: int, seed: int = 0) -> list[ChunkKey]:
    rng = np.random.default_rng(seed)
    return [ChunkKey(rng.bytes(32)) for _ in range(n)]


def given_(entry: Any) -> dict[str, Any]:
    return {RETENTION_KEY: entry}


# -- a tier's admission ---------------------------------------------------------------------
@pytest.mark.parametrize("threshold", [1, 2, 3])
def test_min_reuse_through_the_adapters_gate(threshold):
    gate, chunk = Gate({"min_reuse": threshold}), keys(1)
    for _ in range(threshold - 1):
        assert gate.offer(chunk) == []
    assert gate.offer(chunk) == chunk


@pytest.mark.parametrize("threshold", [2, 3, 5])
def test_min_frequency_through_the_adapters_gate(threshold):
    gate, chunk = Gate({"min_frequency": threshold, "frequency_window": 1000}), keys(1)
    for _ in range(threshold - 1):
        assert gate.offer(chunk) == []
    assert gate.offer(chunk) == chunk


@pytest.mark.parametrize(("others", "kept"), [(0, True), (5, True), (6, False)])
def test_the_frequency_window_through_the_adapters_gate(others, kept):
    """min_frequency 2, frequency_window 8: the chunk's second offer is sighting
    ``others + 2``; the 8th halves its count back to 1."""
    gate, chunk = Gate({"min_frequency": 2, "frequency_window": 8}), keys(1)
    assert gate.offer(chunk) == []
    for seed in range(others):
        gate.runtime.note_offer(keys(1, seed=100 + seed))
    assert (gate.offer(chunk) == chunk) is kept


@pytest.mark.parametrize("length", [1, 3, 4])
def test_min_prefix_chunks_through_the_adapters_gate(length):
    gate, chunks = Gate({"min_prefix_chunks": length}), keys(2)
    assert gate.offer(chunks, prefix=length - 1) == []
    assert gate.offer(chunks, prefix=length) == chunks
    assert gate.offer(chunks, prefix=length + 1) == chunks


@pytest.mark.parametrize("floor", [1, 50, 100])
def test_the_priority_floor_through_the_adapters_gate(floor):
    gate, chunks = Gate(None, min_priority=floor), keys(3)
    priorities = [floor - 1, floor, min(floor + 1, 100)]
    assert gate.offer(chunks, priorities=priorities) == chunks[1:]


def test_offers_without_an_id_are_each_a_sighting():
    """Only one store cascaded to several tiers (one offer id) is one sighting."""
    gate, chunk = Gate({"min_reuse": 2}), keys(1)
    gate.runtime.note_offer(chunk)
    assert gate.offer(chunk) == chunk


# -- a request's retention ------------------------------------------------------------------
@pytest.mark.parametrize(("priority", "valid"), [(-1, False), (0, True), (100, True), (101, False)])
def test_the_priority_range_through_a_requests_retention(priority, valid):
    retentions.set_limits(RequestLimits(100))
    try:
        for entry in ({"priority": priority}, {"ranges": [{"end": 16, "priority": priority}]}):
            context = Context(given_(entry), {b"k": 16})
            retention_of = retention_by_key(context)
            assert is_invalid(context) is not valid
            got = None if retention_of is None else retention_of(b"k")
            assert got == (Retention(priority) if valid else None)
    finally:
        retentions.set_limits(RequestLimits())


@pytest.mark.parametrize(("duration", "valid"), [(0, False), (-1e-9, False), (1e-9, True)])
def test_a_duration_must_be_above_zero_in_a_requests_retention(duration, valid):
    context = Context(given_({"priority": 50, "duration_s": duration}))
    assert is_invalid(context) is not valid
    retention = request_retention(context)
    assert (retention is not None and retention.default == Retention(50, duration)) is valid


@pytest.mark.parametrize(
    ("cap", "asked", "capped"), [(70, 69, False), (70, 70, False), (70, 71, True)]
)
def test_a_request_may_ask_for_exactly_the_cap(cap, asked, capped):
    retentions.set_limits(RequestLimits(cap))
    try:
        context = Context(given_({"priority": asked}))
        retention = request_retention(context)
        assert retention is not None and retention.default == Retention(min(asked, cap))
        assert is_capped(context) is capped
    finally:
        retentions.set_limits(RequestLimits())


@pytest.mark.parametrize(
    ("end_token", "inside"), [(16, False), (17, True), (48, True), (49, False), (None, False)]
)
def test_a_range_covers_chunks_ending_just_inside_it_only(end_token, inside):
    """A range [16, 48) covers the chunks whose last token (end_token - 1) lies in it."""
    asked = parse_retention(
        given_({"priority": 20, "ranges": [{"start": 16, "end": 48, "priority": 80}]})
    )
    assert asked is not None
    assert asked.at(end_token) == Retention(80 if inside else 20)


@pytest.mark.parametrize(
    ("count", "valid"), [(MAX_RANGES - 1, True), (MAX_RANGES, True), (MAX_RANGES + 1, False)]
)
def test_a_request_may_give_exactly_max_ranges(count, valid):
    spans = [{"start": i, "end": i + 1, "priority": 50} for i in range(count)]
    entry = given_({"ranges": spans})
    if valid:
        assert len(parse_retention(entry).ranges) == count  # type: ignore[union-attr]
    else:
        with pytest.raises(InvalidArgumentError, match="ranges"):
            parse_retention(entry)


@pytest.mark.parametrize(
    ("start", "end", "valid"), [(5, 4, False), (5, 5, False), (5, 6, True), (0, 1, True)]
)
def test_an_empty_range_is_refused(start, end, valid):
    entry = given_({"ranges": [{"start": start, "end": end, "priority": 50}]})
    if valid:
        assert parse_retention(entry) is not None
    else:
        with pytest.raises(InvalidArgumentError, match="end"):
            parse_retention(entry)


# -- expiries in vLLM's host memory ---------------------------------------------------------
def test_an_expiry_is_removed_by_a_use_without_a_duration():
    """A chunk retained at 80 for 10 s, then used with 80 for good: past the 10 s it keeps 80
    (its old expiry is gone), so the chunk at the default priority goes first."""
    clock = Clock()
    cache: PriorityCache[str] = PriorityCache(8, "lru", clock)
    cache.note_new([b"kept"], lambda key: Retention(80, 10.0))
    cache.insert(b"kept", "c", evictable=True)
    cache.insert(b"other", "c", evictable=True)
    cache.use([b"kept"], lambda key: Retention(80))
    clock.now = 11.0
    assert [k for k, _ in cache.evict(1, set()) or []] == [b"other"]
    assert cache.priority_of(b"kept") == 80


@pytest.mark.parametrize(("now", "evicted"), [(19.999, b"other"), (20.0, b"kept")])
def test_an_expiry_is_replaced_by_a_later_one(now, evicted):
    """Retained for 10 s at t=0, then again for 10 s at t=10: it ends at 20, not 10."""
    clock = Clock()
    cache: PriorityCache[str] = PriorityCache(8, "lru", clock)
    cache.note_new([b"kept"], lambda key: Retention(80, 10.0))
    cache.insert(b"kept", "c", evictable=True)
    cache.insert(b"other", "c", evictable=True)
    clock.now = 10.0
    cache.use([b"kept"], lambda key: Retention(80, 10.0))
    clock.now = now
    assert [k for k, _ in cache.evict(1, set()) or []] == [evicted]


# -- what the adapter offers a tier's admission (its vLLM-free half: offer_terms) -------------
@pytest.mark.parametrize(
    ("ends", "prefix"),
    [([], 0), ([None], 0), ([16], 1), ([32], 2), ([33], 3), ([16, 47], 3), ([48, 17], 3)],
)
def test_the_offered_prefix_is_the_last_recorded_token_in_whole_chunks(ends, prefix):
    positions = {bytes([i]): end for i, end in enumerate(ends)}
    context = Context(None, positions)
    got, priorities = retentions.offer_terms(list(positions), context, 16)
    assert (got, priorities) == (prefix, [DEFAULT_PRIORITY] * len(ends))


@pytest.mark.parametrize(("end", "kept"), [(32, False), (33, True), (48, True)])
def test_min_prefix_chunks_through_the_adapters_offer(end, kept):
    """min_prefix_chunks 3, 16-token chunks: a store ending at token 32 is a 2-chunk prefix;
    at 33 it reaches into the third chunk."""
    gate, chunks = Gate({"min_prefix_chunks": 3}), keys(1)
    prefix, priorities = retentions.offer_terms([b"k"], Context(None, {b"k": end}), 16)
    assert (gate.offer(chunks, prefix, priorities) == chunks) is kept


def test_the_offered_priorities_are_each_keys_retention_or_the_default():
    entry = {"priority": 60, "ranges": [{"start": 0, "end": 16, "priority": 90}]}
    context = Context(given_(entry), {b"sys": 16, b"q": 32})
    assert retentions.offer_terms([b"sys", b"q"], context, 16) == (2, [90, 60])
    plain = Context(None, {b"sys": 16, b"q": 32})
    assert retentions.offer_terms([b"sys", b"q"], plain, 16) == (2, [DEFAULT_PRIORITY] * 2)
    gate = Gate(None, min_priority=DEFAULT_PRIORITY)
    chunks = keys(2)
    assert gate.offer(chunks, *retentions.offer_terms([b"sys", b"q"], plain, 16)) == chunks
