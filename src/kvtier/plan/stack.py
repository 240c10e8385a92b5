"""LRU stack distances (Mattson) of a chunk reference stream, exact or SHARDS-sampled.

**The stream.** Each request references its chunks in *reverse* prompt order (its last chunk
first, its first chunk last), which is the recency kvtier's integrations leave behind (a
prefix outlives its tail). Every chunk of a request is looked up *before* any of them is
referenced, so a chunk's distance is its position in the LRU stack when the request arrives:
``d`` = how many distinct chunks were used more recently. An LRU cache of ``C`` chunks holds
it exactly when ``d < C``; a chunk never seen before has ``d = COLD``. Because a chunk is always
referenced together with its parent (keys are prefix-chained) and after it, a cache's resident
set is prefix-closed, so per-chunk hits equal the longest cached prefix of each request.

**Exact.** ``stack_distances`` keeps, in a Fenwick tree over stream positions, which positions
are no longer the latest use of their key: ``d = distinct_keys_seen - (a + 1 - removed(<= a))``
for a chunk last used at position ``a``: ``O(log n)`` per reuse, ``O(1)`` per first use. It runs
in pure Python (about 2 to 4 us per reuse).

**Sampled (SHARDS).** Beyond ``exact_limit`` references, keys are sampled by a hash of the key
(every reference of a sampled key is kept), at rate ``R``; distances measured on the sample are
scaled by ``1 / R``. The sample is split into ``K`` disjoint sub-samples; the curve is their mean
and its standard error (their standard deviation over ``sqrt(K)``) is reported.

Runs on the caller's thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtier.plan.trace import Trace

COLD = -1  #: distance of a first use (or a repeat inside one request): never a hit
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


def stack_distances(stream: Stream) -> np.ndarray:
    """Lookup-time LRU stack distance of every reference (``COLD`` for a first use)."""
    prev = previous_use(stream.keys).tolist()
    starts = stream.starts.tolist()
    n = len(prev)
    tree = [0] * (n + 1)
    dist = [COLD] * n
    distinct = 0
    for r in range(len(starts) - 1):
        lo, hi = starts[r], starts[r + 1]
        for j in range(lo, hi):
            a = prev[j]
            if a < lo and a >= 0:
                i, removed = a + 1, 0
                while i:
                    removed += tree[i]
                    i &= i - 1
                dist[j] = distinct - (a + 1 - removed)
        for j in range(lo, hi):
            a = prev[j]
            if a < 0:
                distinct += 1
                continue
            i = a + 1
            while i <= n:
                tree[i] += 1
                i += i & -i
    return np.array(dist, dtype=np.int64)


def sample_buckets(keys: np.ndarray, salt: int = 0) -> np.ndarray:
    """A uniform 24-bit bucket per key (a multiplicative hash of the key and ``salt``)."""
    mixed = (keys ^ np.uint64(salt)) * _MIX
    return (mixed >> np.uint64(40)).astype(np.int64)


@dataclass
class Sample:
    """One (sub-)sample: its stream, LRU distances scaled to the full trace, and its weight:
    prompt tokens of the full trace each of its usable references stands for."""

    stream: Stream
    distances: np.ndarray  # float64, scaled; inf for COLD
    weight: float
    rate: float


def samples(stream: Stream, exact_limit: int, parts: int = 4, salt: int = 0) -> list[Sample]:
    """The whole stream as one exact sample when it has at most ``exact_limit`` references;
    else ``parts`` disjoint SHARDS sub-samples of about ``exact_limit / parts`` each."""
    if len(stream) <= exact_limit:
        return [measure(stream, 1.0, stream.usable.sum())]
    rate = exact_limit / len(stream)
    buckets = sample_buckets(stream.keys, salt)
    chosen = buckets < int(rate * _BUCKETS)
    total_usable = int(stream.usable.sum())
    result = []
    for part in range(parts):
        sub = stream.subset(chosen & (buckets % parts == part))
        result.append(measure(sub, rate / parts, total_usable, parts))
    return result


def measure(stream: Stream, rate: float, total_usable: int, parts: int = 1) -> Sample:
    """LRU distances of a sample taken at ``rate``, scaled by ``1 / rate``; the weight makes
    ``parts`` sub-samples average to the full trace (SHARDS-adj: the sample's actual usable
    share, not the nominal rate)."""
    raw = stack_distances(stream)
    distances = np.where(raw == COLD, np.inf, raw / rate)
    sampled_usable = max(1, int(stream.usable.sum()))
    weight = stream.chunk_tokens * total_usable / sampled_usable / parts
    return Sample(stream, distances, weight, rate)


def rescan(sample: Sample, mask: np.ndarray) -> Sample:
    """LRU distances of the sub-stream ``mask`` of a sample (e.g. admitted chunks, or chunks
    that missed host memory), at the sample's rate and weight."""
    sub = sample.stream.subset(mask)
    raw = stack_distances(sub)
    distances = np.where(raw == COLD, np.inf, raw / sample.rate)
    full = np.full(len(sample.stream), np.inf)
    full[np.flatnonzero(mask)] = distances
    return Sample(sample.stream, full, sample.weight, sample.rate)


def first_uses(stream: Stream) -> np.ndarray:
    """Whether each reference is its key's first use."""
    return previous_use(stream.keys) < 0
