"""Reuse in a trace: how much of the prompts repeats, by chunk size, and how far apart.

* ``reuse_by_chunk_size``: for each candidate chunk size (multiples of the trace's), the share
  of all prompt tokens in usable chunks some earlier request already had (what an infinite
  cache serves), and the share of requests that reuse nothing.
* ``histograms``: reuse distances of the chunks that are reused, in bytes (the LRU cache size
  that would have kept the chunk) and in time since the chunk was first created, each split
  by prefix length (tokens from the start of the prompt to the end of the chunk).

Runs on the caller's thread; vectorized with numpy (a few sorts of the key array).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtier.plan.stack import Sample
from kvtier.plan.trace import Trace

#: Prefix-length buckets (tokens) of the histograms; the last one is open.
PREFIX_EDGES = (1024, 4096, 16384)
PREFIX_LABELS = ("<= 1K tokens", "1K-4K", "4K-16K", "> 16K")
#: Age buckets (seconds since the chunk was created).
AGE_EDGES = (1.0, 10.0, 60.0, 600.0, 3600.0, 6 * 3600.0, 86400.0)


@dataclass(frozen=True)
class ChunkReuse:
    """Reuse of one chunk size: ``reuse_share`` of all prompt tokens are in usable chunks seen
    before; ``unique_share`` of requests reuse no chunk; ``distinct`` chunks in the trace."""

    chunk_tokens: int
    reuse_share: float
    unique_share: float
    distinct: int
    chunks: int


@dataclass(frozen=True)
class _Fine:
    """Per reference of the trace's own chunks: its request, its index in the prompt, and
    whether an earlier reference had its key; ``positional``: every key sits at one index in
    every prompt (true of prefix-chained keys), so a coarser size keeps or drops all of a key's
    references and its first uses are the fine ones it keeps."""

    request: np.ndarray
    pos: np.ndarray
    seen_before: np.ndarray
    positional: bool

    @classmethod
    def of(cls, trace: Trace) -> _Fine:
        request = np.repeat(
            np.arange(trace.num_requests, dtype=np.int64), trace.chunks_per_request()
        )
        pos = np.arange(trace.num_chunks, dtype=np.int64) - trace.offsets[request]
        order = np.argsort(trace.keys, kind="stable")  # quicksort degrades on repeated keys
        ordered = trace.keys[order]
        same = ordered[1:] == ordered[:-1]
        seen_before = np.ones(len(order), dtype=bool)
        seen_before[order[np.flatnonzero(np.concatenate([[len(order) > 0], ~same]))]] = False
        by_key = pos[order]
        positional = bool(np.all(by_key[1:][same] == by_key[:-1][same]))
        return cls(request, pos, seen_before, positional)


def chunk_reuse(trace: Trace, coarsen: int, fine: _Fine | None = None) -> ChunkReuse:
    """Reuse at ``coarsen`` x the trace's chunk size (vectorized; one sort of the keys, shared
    by every size through ``fine`` when keys are positional)."""
    fine = fine or _Fine.of(trace)
    keep = fine.pos % coarsen == coarsen - 1
    keys, request, pos = trace.keys[keep], fine.request[keep], fine.pos[keep] // coarsen
    tokens = trace.chunk_tokens * coarsen
    if fine.positional:
        seen_before = fine.seen_before[keep]
    else:
        _, first_index = np.unique(keys, return_index=True)
        seen_before = np.ones(len(keys), dtype=bool)
        seen_before[first_index] = False
    usable = pos < np.maximum(trace.prompt_tokens[request] - 1, 0) // tokens
    reused = seen_before & usable
    requests = request[reused]  # sorted: count its distinct values
    reusing_requests = int(np.count_nonzero(requests[1:] != requests[:-1])) + int(len(requests) > 0)
    total_tokens = max(1, int(trace.prompt_tokens.sum()))
    return ChunkReuse(
        chunk_tokens=tokens,
        reuse_share=float(reused.sum()) * tokens / total_tokens,
        unique_share=1.0 - reusing_requests / max(1, trace.num_requests),
        distinct=int(np.count_nonzero(~seen_before)),
        chunks=len(keys),
    )


def reuse_by_chunk_size(trace: Trace, max_tokens: int, block: int) -> list[ChunkReuse]:
    """``chunk_reuse`` for every power-of-two multiple of the trace's chunk size up to
    ``max_tokens`` that is also a multiple of the engine block size ``block``."""
    fine = _Fine.of(trace)
    results, coarsen = [], 1
    while trace.chunk_tokens * coarsen <= max_tokens:
        if (trace.chunk_tokens * coarsen) % block == 0:
            results.append(chunk_reuse(trace, coarsen, fine))
        coarsen *= 2
    return results or [chunk_reuse(trace, 1, fine)]


def pick_chunk_size(
    options: list[ChunkReuse], bytes_per_token: int, max_chunk_bytes: int, keep: float = 0.95
) -> ChunkReuse:
    """The largest chunk size that keeps ``keep`` of the finest size's reuse and whose chunk
    fits ``max_chunk_bytes`` (larger chunks: fewer, bigger transfers and files)."""
    finest = options[0]
    good = [
        o
        for o in options
        if o.reuse_share >= keep * finest.reuse_share
        and o.chunk_tokens * bytes_per_token <= max_chunk_bytes
    ]
    return max(good, key=lambda o: o.chunk_tokens) if good else finest


def creation_times(sample: Sample, times: np.ndarray) -> np.ndarray:
    """Arrival time of the request that first used each reference's key."""
    keys = sample.stream.keys
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    group_start = np.ones(len(keys), dtype=bool)
    group_start[1:] = ordered[1:] != ordered[:-1]
    first_of_group = order[np.maximum.accumulate(np.where(group_start, np.arange(len(keys)), 0))]
    created = np.empty(len(keys))
    created[order] = times[sample.stream.request[first_of_group]]
    return created


@dataclass(frozen=True)
class Histograms:
    """Reused prompt tokens per (prefix-length bucket, distance bin): ``bytes_tokens[p][b]``
    for LRU distance bins ``bytes_edges`` (bytes), ``age_tokens[p][b]`` for ``AGE_EDGES``."""

    bytes_edges: list[float]
    bytes_tokens: list[list[float]]
    age_tokens: list[list[float]]


def histograms(samples: list[Sample], times: np.ndarray, chunk_bytes: int) -> Histograms:
    """Reuse-distance histograms (in bytes and in seconds since creation) of the samples."""
    finite = [s.distances[np.isfinite(s.distances) & s.stream.usable] for s in samples]
    top = max([float(f.max()) for f in finite if len(f)] + [1.0]) + 1
    edges = [0.0] + [chunk_bytes * 2.0**k for k in range(int(np.ceil(np.log2(top))) + 1)]
    by_bytes = np.zeros((len(PREFIX_LABELS), len(edges) - 1))
    by_age = np.zeros((len(PREFIX_LABELS), len(AGE_EDGES) + 1))
    for sample in samples:
        reuse = np.isfinite(sample.distances) & sample.stream.usable
        prefix_tokens = (sample.stream.pos[reuse] + 1) * sample.stream.chunk_tokens
        bucket = np.searchsorted(PREFIX_EDGES, prefix_tokens, side="left")
        size = sample.distances[reuse] * chunk_bytes
        size_bin = np.clip(np.searchsorted(edges, size, side="right") - 1, 0, len(edges) - 2)
        weight = sample.weight[reuse]
        np.add.at(by_bytes, (bucket, size_bin), weight)
        age = times[sample.stream.request[reuse]] - creation_times(sample, times)[reuse]
        np.add.at(by_age, (bucket, np.searchsorted(AGE_EDGES, age, side="right")), weight)
    return Histograms(edges, by_bytes.tolist(), by_age.tolist())
