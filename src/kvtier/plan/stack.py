"""LRU stack distances (Mattson) of a chunk reference stream, exact or SHARDS-sampled.

**The stream.** Each request references its chunks in *reverse* prompt order (its last chunk
first, its first chunk last), which is the recency kvtier's integrations leave behind (a
prefix outlives its tail). Every chunk of a request is looked up *before* any of them is
referenced, so a chunk's distance is its position in the LRU stack when the request arrives:
``d`` = how many distinct chunks were used more recently. An LRU cache of ``C`` chunks holds
it exactly when ``d < C``; a chunk never seen before has ``d = inf``. Because a chunk is always
referenced together with its parent (keys are prefix-chained) and after it, a cache's resident
set is prefix-closed, so per-chunk hits equal the longest cached prefix of each request.

**Exact.** For a chunk last used at position ``a`` whose request starts at ``lo``, ``d`` is the
number of distinct keys in ``(a, lo)``: the references ``q < lo`` whose previous use is at most
``a``, less the ``a + 1`` references up to ``a``. ``stack_distances`` counts those for every
reuse at once with numpy (``_prefix_at_most``: one sort per power of two, ``O(n log^2 n)`` in
vectorized steps, about 1 s per million references). Weighted distances count each weight
(mark) class apart and add ``weight * count``, so they are exact up to one rounding.

**Sampled (SHARDS).** Beyond ``exact_limit`` references, keys are sampled by a hash of the key
(every reference of a sampled key is kept), at rate ``R``; a sampled key stands for ``1 / R``
keys, so distances are weighted sums. The sample is split into ``K`` disjoint sub-samples; the
curve is their mean and its standard error (their standard deviation over ``sqrt(K)``) is
reported. The hottest keys are kept in every sub-sample at weight 1, as many as fit a budget
of ``exact_limit / (2 K)`` references: spatial sampling would otherwise keep or drop them for
all sub-samples at once, a bias no spread between sub-samples reveals. Keys too hot for that
budget (a system prompt shared by most requests) are sampled like the others, so a trace
dominated by a few such prefixes may be estimated low at small capacities; a larger
``exact_limit`` reduces that.

Runs on the caller's thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvtier.plan.trace import Trace

_MIX = np.uint64(0x9E3779B97F4A7C15)
_BUCKETS = 1 << 24
_LOW = (1 << 32) - 1
_ABSENT = _LOW  # a value above every bound


@dataclass
class Stream:
    """References in processing order: request ``r`` is ``starts[r]:starts[r + 1]``.

    ``pos`` is each chunk's index in its prompt, ``usable`` whether a cache may serve it,
    ``request`` its request index.
    """

    keys: np.ndarray
    starts: np.ndarray
    pos: np.ndarray
    usable: np.ndarray
    request: np.ndarray
    chunk_tokens: int
    _previous: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.keys)

    def previous(self) -> np.ndarray:
        """``previous_use`` of the keys, computed once."""
        if self._previous is None:
            self._previous = previous_use(self.keys)
        return self._previous

    def subset(self, mask: np.ndarray) -> Stream:
        """The references where ``mask`` holds, request boundaries kept."""
        request = self.request[mask]
        counts = np.bincount(request, minlength=len(self.starts) - 1)
        starts = np.zeros(len(self.starts), dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        return Stream(
            self.keys[mask], starts, self.pos[mask], self.usable[mask], request, self.chunk_tokens
        )


def build_stream(trace: Trace, coarsen: int = 1) -> Stream:
    """The reference stream of ``trace`` at ``coarsen`` x its chunk size.

    A coarser chunk's key is the key of the last fine chunk it covers (keys are chained, so
    that key names the whole prefix).
    """
    counts = trace.chunks_per_request()
    request = np.repeat(np.arange(trace.num_requests, dtype=np.int64), counts)
    pos = np.arange(trace.num_chunks, dtype=np.int64) - trace.offsets[request]
    keep = pos % coarsen == coarsen - 1
    tokens = trace.chunk_tokens * coarsen
    usable_chunks = np.maximum(trace.prompt_tokens - 1, 0) // tokens
    keys, request, pos = trace.keys[keep], request[keep], pos[keep] // coarsen
    per_request = np.bincount(request, minlength=trace.num_requests)
    starts = np.zeros(trace.num_requests + 1, dtype=np.int64)
    np.cumsum(per_request, out=starts[1:])
    # reverse each request: a prefix is used after its tail
    reverse = starts[request] + starts[request + 1] - 1 - np.arange(len(keys), dtype=np.int64)
    keys, pos, request = keys[reverse], pos[reverse], request[reverse]
    usable = pos < usable_chunks[request]
    return Stream(keys, starts, pos, usable, request, tokens)


def previous_use(keys: np.ndarray) -> np.ndarray:
    """For each reference, the position of the previous reference to its key, or -1."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    prev = np.full(len(keys), -1, dtype=np.int64)
    same = ordered[1:] == ordered[:-1]
    prev[order[1:][same]] = order[:-1][same]
    return prev


def stack_distances(stream: Stream, marks: np.ndarray | None = None) -> np.ndarray:
    """Lookup-time LRU stack distance of every reference: the total ``marks`` weight of the
    distinct keys used more recently (weight 1 each by default, so the count of them); ``inf``
    for a first use or a repeat inside one request. ``marks`` must be the same for every
    reference of a key (the weight of the key)."""
    prev = stream.previous()
    lo = stream.starts[stream.request]  # where each reference's request starts
    query = (prev >= 0) & (prev < lo)
    dist = np.full(len(prev), np.inf)
    last, bounds = prev[query], lo[query]
    if marks is None:
        classes, cls = np.ones(1), np.zeros(len(prev), dtype=np.int64)
    else:
        classes = np.unique(marks)  # a few values: a hash, no sort
        cls = np.searchsorted(classes, marks)
    total = np.zeros(len(last))
    for c, weight in enumerate(classes.tolist()):
        mine = cls == c
        values = np.where(mine, prev + 1, _ABSENT)
        before = np.concatenate([[0], np.cumsum(mine)])[last + 1]
        total += weight * (_prefix_at_most(values, bounds, last + 1) - before)
    dist[query] = total
    return dist


def _prefix_at_most(values: np.ndarray, ends: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """For each query ``i``: how many ``values[:ends[i]]`` are at most ``bounds[i]`` (all
    below ``2**32``). The prefix is cut into aligned blocks of ``2**k`` positions, one per set
    bit ``k`` of ``ends[i]``; a sort by (block, value) per ``k`` answers every query's block of
    that size with one ``searchsorted``."""
    n = len(values)
    if n >= 1 << 31:
        raise ValueError(f"{n} references: at most 2**31 per stack-distance run")
    counts = np.zeros(len(ends), dtype=np.int64)
    keys = (np.arange(n, dtype=np.int64) << 32) | values  # blocks of one position: sorted
    for k in range(n.bit_length() + 1):
        if k:  # halve the block count: blocks merge pairwise, each pair two sorted runs
            keys = np.sort(((keys >> 33) << 32) | (keys & _LOW), kind="stable")
        has = ((ends >> k) & 1).astype(bool)
        block = (ends[has] >> k) - 1
        found = np.searchsorted(keys, (block << 32) | bounds[has], side="right")
        counts[has] += found - (block << k)
    return counts


def sample_buckets(keys: np.ndarray, salt: int = 0) -> np.ndarray:
    """A uniform 24-bit bucket per key (a multiplicative hash of the key and ``salt``)."""
    mixed = (keys ^ np.uint64(salt)) * _MIX
    return (mixed >> np.uint64(40)).astype(np.int64)


@dataclass
class Sample:
    """One (sub-)sample: its stream, LRU distances in units of the full trace (``inf`` for a
    first use), each reference's mark weight (the keys of the full trace its key stands for),
    and each reference's weight: the prompt tokens of the full trace one of its usable
    references stands for."""

    stream: Stream
    distances: np.ndarray
    marks: np.ndarray
    weight: np.ndarray
    rate: float
    hot_keys: int = 0


def samples(stream: Stream, exact_limit: int, parts: int = 4, salt: int = 0) -> list[Sample]:
    """The whole stream as one exact sample when it has at most ``exact_limit`` references;
    else ``parts`` SHARDS sub-samples: the hottest keys (at most ``exact_limit / (2 * parts)``
    references) are in every sub-sample with weight 1, so one very popular prefix cannot be in
    or out of all of them at once; the other keys are split by hash into ``parts`` disjoint
    samples sharing the rest of the ``exact_limit`` budget."""
    tokens = float(stream.chunk_tokens)
    if len(stream) <= exact_limit:
        ones = np.ones(len(stream))
        return [Sample(stream, stack_distances(stream), ones, ones * tokens, 1.0)]
    hot = hot_references(stream.keys, exact_limit // (2 * parts))
    normal = ~hot
    budget = exact_limit - parts * int(hot.sum())  # every sub-sample holds the hot references
    rate = min(1.0, budget / max(1, int(normal.sum())))
    buckets = sample_buckets(stream.keys, salt)
    chosen = normal & (buckets < int(rate * _BUCKETS))
    normal_usable = max(1, int((normal & stream.usable).sum()))
    result = []
    for part in range(parts):
        mask = hot | (chosen & (buckets % parts == part))
        sub = stream.subset(mask)
        sub_hot = hot[mask]
        sub_rate = rate / parts
        marks = np.where(sub_hot, 1.0, 1.0 / sub_rate)
        sampled_usable = max(1, int((~sub_hot & sub.usable).sum()))
        weight = np.where(sub_hot, tokens, tokens * normal_usable / sampled_usable) / parts
        hot_count = int(np.unique(stream.keys[hot]).size)
        result.append(Sample(sub, stack_distances(sub, marks), marks, weight, sub_rate, hot_count))
    return result


def hot_references(keys: np.ndarray, budget: int) -> np.ndarray:
    """Which references belong to the most used keys, as many keys as fit ``budget``
    references (keys used once never count)."""
    order = np.argsort(keys, kind="stable")  # np.unique's quicksort degrades on repeated keys
    ordered = keys[order]
    starts = np.flatnonzero(np.concatenate([[len(keys) > 0], ordered[1:] != ordered[:-1]]))
    counts = np.diff(np.append(starts, len(keys)))
    inverse = np.empty(len(keys), dtype=np.int64)
    inverse[order] = np.repeat(np.arange(len(starts)), counts)
    order = np.argsort(-counts, kind="stable")
    candidates = order[(counts[order] <= budget) & (counts[order] > 1)]
    fits = candidates[np.cumsum(counts[candidates]) <= budget]
    is_hot = np.zeros(len(starts), dtype=bool)
    is_hot[fits] = True
    hot: np.ndarray = is_hot[inverse]
    return hot


def measure(stream: Stream, rate: float, total_usable: int) -> Sample:
    """LRU distances of a plain sample taken at ``rate`` (every key weighs ``1 / rate``)."""
    marks = np.full(len(stream), 1.0 / rate)
    sampled_usable = max(1, int(stream.usable.sum()))
    weight = np.full(len(stream), stream.chunk_tokens * total_usable / sampled_usable)
    return Sample(stream, stack_distances(stream, marks), marks, weight, rate)


def rescan(sample: Sample, mask: np.ndarray) -> Sample:
    """LRU distances of the sub-stream ``mask`` of a sample (e.g. admitted chunks, or chunks
    that missed host memory), with the sample's weights; ``inf`` outside the mask."""
    sub = sample.stream.subset(mask)
    full = np.full(len(sample.stream), np.inf)
    full[np.flatnonzero(mask)] = stack_distances(sub, sample.marks[mask])
    return Sample(sample.stream, full, sample.marks, sample.weight, sample.rate, sample.hot_keys)


def first_uses(stream: Stream) -> np.ndarray:
    """Whether each reference is its key's first use."""
    first: np.ndarray = stream.previous() < 0
    return first
