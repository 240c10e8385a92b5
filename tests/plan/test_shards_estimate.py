"""The planner's sampled (SHARDS) LRU curve against the exact one, on traces whose answer is
known, within the bound ``docs/planner.md`` states (the sub-samples' standard error).

``cyclic_docs(N, 1, R)``: request i reads document i % N (one chunk), so every reuse has LRU
stack distance N - 1: a cache of N - 1 chunks serves nothing, one of N chunks serves every
reuse, ``(R - N) * 16`` tokens of ``R * 26``.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.plan.curves import stack_curve
from kvtier.plan.stack import build_stream, samples
from tests.plan.helpers import cyclic_docs, shared_prefixes

DOCS, REQUESTS, TOKENS = 2000, 20000, 16
PROMPT = TOKENS + 10
KNOWN = (REQUESTS - DOCS) * TOKENS / (REQUESTS * PROMPT)


@pytest.fixture(scope="module")
def cyclic():
    return build_stream(cyclic_docs(DOCS, 1, REQUESTS, TOKENS))


def curve(stream, exact_limit: int, grid: list[float]):
    total = float(REQUESTS * PROMPT)
    return stack_curve("lru", samples(stream, exact_limit), np.array(grid), total)


def test_the_exact_curve_steps_at_the_known_distance(cyclic):
    exact = curve(cyclic, 10**9, [1, DOCS - 1, DOCS, 2 * DOCS])
    assert exact.error == 0 and exact.method == "exact LRU stack distances"
    assert exact.hit.tolist() == pytest.approx([0, 0, KNOWN, KNOWN])


def test_the_sampled_curve_is_the_known_answer_within_its_standard_error(cyclic):
    """Sampled at a quarter of the trace: nothing served at half the distance, every reuse
    from 1.5 times it; each point within 4 standard errors (+ 0.02) of the exact curve."""
    grid = [DOCS / 2, 1.5 * DOCS, 3 * DOCS]
    sampled = curve(cyclic, len(cyclic) // 4, grid)
    assert sampled.method.startswith("SHARDS")
    assert 0 < sampled.error < 0.05
    expected = np.array([0.0, KNOWN, KNOWN])
    assert np.abs(sampled.hit - expected).max() <= 4 * sampled.error + 0.02


@pytest.mark.parametrize("seed", [5, 6])
def test_sampled_and_exact_agree_on_zipf_prefixes(seed):
    """Popular prefixes: the hottest keys are kept exactly in every sub-sample."""
    stream = build_stream(shared_prefixes(6000, seed=seed, docs=400))
    total = float(int(stream.usable.sum()) * 16)
    grid = np.array([10, 50, 200, 800, 2000])
    exact = stack_curve("x", samples(stream, exact_limit=10**9), grid, total)
    parts = samples(stream, exact_limit=len(stream) // 3)
    assert parts[0].hot_keys > 0
    sampled = stack_curve("x", parts, grid, total)
    assert np.abs(sampled.hit - exact.hit).max() <= 4 * sampled.error + 0.02


@pytest.mark.parametrize(("limit", "exact"), [(0, True), (-1, False)])
def test_a_trace_of_exactly_exact_limit_references_is_not_sampled(cyclic, limit, exact):
    parts = samples(cyclic, len(cyclic) + limit)
    assert (len(parts), parts[0].rate == 1.0) == ((1, True) if exact else (4, False))


def test_the_standard_error_is_the_sub_samples_spread_over_the_root_of_their_number(cyclic):
    grid = np.array([DOCS / 2, DOCS * 0.9, DOCS * 1.1, 3 * DOCS])
    total = float(REQUESTS * PROMPT)
    parts = samples(cyclic, len(cyclic) // 4)
    each = np.array([stack_curve("x", [p], grid, total).hit for p in parts]) * len(parts)
    expected = (each.std(axis=0, ddof=1) / np.sqrt(len(parts))).max()
    assert expected > 0
    assert stack_curve("x", parts, grid, total).error == pytest.approx(expected)
