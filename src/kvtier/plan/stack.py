"""LRU stack distances (Mattson) of a chunk reference stream, exact or SHARDS-sampled.

**The stream.** Each request references its chunks in *reverse* prompt order (its last chunk
first, its first chunk last), which is the recency kvtier's integrations leave behind (a
prefix outlives its tail). Every chunk of a request is looked up *before* any of them is
referenced, so a chunk's distance is its position in the LRU stack when the request arrives:
``d`` = how many distinct chunks were used more recently. An LRU cache of ``C`` chunks holds
it exactly when ``d < C``; a chunk never seen before has ``d = inf``. Because a chunk is always
referenced together with its parent (keys are prefix-chained) and after it, a cache's resident
set is prefix-closed, so per-chunk hits equal the longest cached prefix of each request.

**Exact.** ``stack_distances`` keeps, in a Fenwick tree over stream positions, which positions
are no longer the latest use of their key: ``d = distinct_keys_seen - (a + 1 - removed(<= a))``
for a chunk last used at position ``a``: ``O(log n)`` per reuse, ``O(1)`` per first use. It runs
in pure Python (about 2 to 4 us per reuse).

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

from dataclasses import dataclass

import numpy as np

from kvtier.plan.trace import Trace

_MIX = np.uint64(0x9E3779B97F4A7C15)
_BUCKETS = 1 << 24


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

    def __len__(self) -> int:
        return len(self.keys)

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
    for a first use or a repeat inside one request."""
    prev = previous_use(stream.keys).tolist()
    starts = stream.starts.tolist()
    n = len(prev)
    weights = [1.0] * n if marks is None else marks.tolist()
    below = np.concatenate([[0.0], np.cumsum(weights)]).tolist()  # weight of positions < i
    tree = [0.0] * (n + 1)
    dist = [np.inf] * n
    distinct = 0.0
    for r in range(len(starts) - 1):
        lo, hi = starts[r], starts[r + 1]
        for j in range(lo, hi):
            a = prev[j]
            if a < lo and a >= 0:
                i, removed = a + 1, 0.0
                while i:
                    removed += tree[i]
                    i &= i - 1
                dist[j] = distinct - (below[a + 1] - removed)
        for j in range(lo, hi):
            a = prev[j]
            if a < 0:
                distinct += weights[j]
                continue
            i, w = a + 1, weights[a]
            while i <= n:
                tree[i] += w
                i += i & -i
    return np.array(dist, dtype=np.float64)


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
    unique, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    candidates = order[(counts[order] <= budget) & (counts[order] > 1)]
    fits = candidates[np.cumsum(counts[candidates]) <= budget]
    is_hot = np.zeros(len(unique), dtype=bool)
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
    return previous_use(stream.keys) < 0
