"""The vectorized stack distances and reuse-by-size against plain references."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from kvtier.plan.reuse import _Fine, chunk_reuse
from kvtier.plan.stack import Stream, stack_distances
from kvtier.plan.trace import Trace
from tests.plan.helpers import shared_prefixes


def weighted_brute_force(stream: Stream, weight: dict[int, float]) -> list[float]:
    """Total weight of the distinct keys used since a reference's previous use, at its
    request's arrival; inf for a first use or a repeat inside the request."""
    keys, starts, out = stream.keys.tolist(), stream.starts.tolist(), []
    last: dict[int, int] = {}
    for lo, hi in pairwise(starts):
        for j in range(lo, hi):
            a = lo if keys[j] in keys[lo:j] else last.get(keys[j], lo)
            out.append(float(sum(weight[x] for x in set(keys[a + 1 : lo]))) if a < lo else np.inf)
        for j in range(lo, hi):
            last[keys[j]] = j
    return out


def random_stream(rng: np.random.Generator) -> Stream:
    n, distinct = int(rng.integers(1, 200)), int(rng.integers(1, 40))
    keys = rng.integers(0, distinct, n).astype(np.uint64)
    cuts = rng.integers(0, n + 1, int(rng.integers(0, n + 1)))
    starts = np.unique(np.concatenate([[0, n], cuts])).astype(np.int64)
    request = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    return Stream(keys, starts, np.zeros(n, np.int64), np.ones(n, bool), request, 16)


@pytest.mark.parametrize("seed", range(40))
def test_stack_distances_equal_a_weighted_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    stream = random_stream(rng)
    per_key = rng.choice([1.0, 2.5, 40.0], 64).tolist()
    weight = {k: per_key[k] for k in range(64)}
    marks = np.array([weight[k] for k in stream.keys.tolist()])
    expected = weighted_brute_force(stream, weight)
    assert stack_distances(stream, marks) == pytest.approx(expected, rel=1e-12)
    ones = dict.fromkeys(range(64), 1.0)
    assert stack_distances(stream).tolist() == weighted_brute_force(stream, ones)


def test_reuse_by_size_shares_one_sort_only_for_positional_keys() -> None:
    trace = shared_prefixes(300)
    fine = _Fine.of(trace)
    assert fine.positional
    unshared = _Fine(fine.request, fine.pos, fine.seen_before, positional=False)
    for coarsen in (1, 2, 4):
        assert chunk_reuse(trace, coarsen, fine) == chunk_reuse(trace, coarsen, unshared)
    moved = Trace(
        chunk_tokens=trace.chunk_tokens,
        times=trace.times,
        prompt_tokens=trace.prompt_tokens,
        output_tokens=trace.output_tokens,
        offsets=trace.offsets,
        keys=np.roll(trace.keys, 1),
        skipped=trace.skipped,
        header=trace.header,
    )
    assert not _Fine.of(moved).positional
