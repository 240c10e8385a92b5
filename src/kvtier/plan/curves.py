"""Miss-ratio curves, read as hit ratios: the share of all prompt tokens a cache serves,
against its capacity (in chunks).

* LRU (the device pool, the host tier): from stack distances (``stack``), exact or SHARDS.
* LRU with second-use admission: stack distances of the sub-stream of chunks used before.
* ARC (with and without admission): not a stack algorithm, so kvtier's ``ARCPolicy`` is run
  (``sim``) at a few capacities, on a miniature sample when the trace is large (cache sizes
  scaled by the sampling rate); the error is estimated by running LRU on the same miniature and
  comparing it with the full LRU curve.
* host + one secondary tier: the secondary tier sees only the chunks that missed the device
  pool and host memory (it is written when host memory stores a chunk, and read when host
  memory misses), so its curve comes from the stack distances of that sub-stream; a request's
  hits are cut at its first miss (longest cached prefix).

Runs on the caller's thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtier.plan.sim import curve as policy_hits
from kvtier.plan.stack import Sample, Stream, first_uses, rescan, sample_buckets

_BIG = 1 << 40


@dataclass
class Curve:
    """``hit[i]``: share of prompt tokens served by a cache of ``capacities[i]`` chunks;
    ``error``: largest standard error of ``hit`` (0 when exact); ``method``: how it was got."""

    name: str
    capacities: np.ndarray
    hit: np.ndarray
    error: float
    method: str

    def at(self, capacity: float) -> float:
        """The hit ratio at ``capacity`` chunks (step interpolation: the largest grid point
        not above it; 0 below the grid)."""
        index = int(np.searchsorted(self.capacities, capacity, side="right")) - 1
        return float(self.hit[index]) if index >= 0 else 0.0

    def to_json(self, chunk_bytes: int) -> dict[str, object]:
        return {
            "name": self.name,
            "method": self.method,
            "standard_error": round(self.error, 5),
            "capacity_bytes": [int(c) * chunk_bytes for c in self.capacities],
            "hit_ratio": [round(float(h), 5) for h in self.hit],
        }


def capacity_grid(top: float, points: int = 48) -> np.ndarray:
    """Log-spaced capacities (chunks) from 1 to past ``top``, distinct integers."""
    top = max(2.0, top * 1.25)
    return np.unique(np.round(np.geomspace(1, top, points)).astype(np.int64))


def method_of(samples: list[Sample]) -> str:
    if len(samples) == 1 and samples[0].rate == 1.0:
        return "exact LRU stack distances"
    rate = sum(s.rate for s in samples)
    return (
        f"SHARDS spatial sampling at {rate:.3%} of keys, {len(samples)} sub-samples "
        f"(+ the {samples[0].hot_keys} hottest keys exactly)"
    )


def stack_curve(
    name: str,
    samples: list[Sample],
    capacities: np.ndarray,
    total_tokens: float,
    need: list[np.ndarray] | None = None,
) -> Curve:
    """Hit ratio at each capacity from distances (``need``: per sample, the capacity each
    reference needs to hit; default its LRU distance)."""
    parts = []
    for i, sample in enumerate(samples):
        values = sample.distances if need is None else need[i]
        usable = sample.stream.usable
        order = np.argsort(values[usable], kind="stable")
        served = np.concatenate([[0.0], np.cumsum(sample.weight[usable][order])])
        index = np.searchsorted(values[usable][order], capacities, side="left")
        parts.append(served[index])
    estimates = np.array(parts) / total_tokens
    hit = estimates.sum(axis=0)
    error = 0.0
    if len(parts) > 1:
        error = float((estimates * len(parts)).std(axis=0, ddof=1).max() / np.sqrt(len(parts)))
    return Curve(name, capacities, hit, error, method_of(samples))


def admitted_samples(samples: list[Sample]) -> list[Sample]:
    """Distances under second-use admission: only chunks used before are ever stored."""
    return [rescan(s, ~first_uses(s.stream)) for s in samples]


def host_level_hits(sample: Sample, host: Sample, device: float, capacity: float) -> np.ndarray:
    """Which references the device pool (LRU, ``device`` chunks) or host memory (``host``
    distances, ``capacity`` chunks) serve."""
    return (sample.distances < device) | (host.distances < capacity)


def secondary_needs(
    samples: list[Sample], hosts: list[Sample], device: float, capacity: float, admission: bool
) -> list[np.ndarray]:
    """Per sample, the secondary-tier capacity each reference needs to be served from the
    device pool, host memory or that tier (0 for the first two, inf for never)."""
    needs = []
    for sample, host in zip(samples, hosts, strict=True):
        served = host_level_hits(sample, host, device, capacity)
        reaches = ~served & (~first_uses(sample.stream) if admission else True)
        tier = rescan(sample, reaches).distances
        need = np.where(served, 0.0, tier)
        if sample.rate == 1.0:
            need = prefix_closed(need, sample.stream)
        needs.append(need)
    return needs


def prefix_closed(need: np.ndarray, stream: Stream) -> np.ndarray:
    """Each reference's need raised to the largest need of the chunks before it in its
    prompt: a request is served only up to its first miss."""
    if len(stream.starts) > 1 << 22:  # rank * _BIG would overflow; per-chunk counts instead
        return need
    # the stream has each request's chunks last-first: reversed, the array runs requests
    # last-first with each prompt in order, so a running maximum per request does it
    values = np.minimum(need[::-1], _BIG - 1).astype(np.int64)
    rank = (len(stream.starts) - 2 - stream.request[::-1]).astype(np.int64)
    running = np.maximum.accumulate(values + rank * _BIG) - rank * _BIG
    closed = running[::-1].astype(np.float64)
    return np.where(closed >= _BIG - 1, np.inf, closed)


def miniature(stream: Stream, limit: int, salt: int = 1) -> tuple[Stream, float]:
    """A sample of about ``limit`` references (all of them when the stream is that small)."""
    if len(stream) <= limit:
        return stream, 1.0
    rate = limit / len(stream)
    return stream.subset(sample_buckets(stream.keys, salt) < int(rate * (1 << 24))), rate


def policy_curve(
    name: str,
    stream: Stream,
    rate: float,
    policy: str,
    admission: bool,
    capacities: np.ndarray,
    total: tuple[float, int],
) -> Curve:
    """Hit ratio of kvtier's ``policy`` class at each capacity, simulated on ``stream`` (a
    miniature taken at ``rate``; ``total`` = (all prompt tokens, all usable chunks))."""
    total_tokens, total_usable = total
    mini = np.maximum(1, np.round(capacities * rate)).astype(np.int64)
    hits = policy_hits(stream, policy, mini, admission, prefix=rate == 1.0)
    per_chunk = stream.chunk_tokens * total_usable / max(1, int(stream.usable.sum()))
    method = "kvtier's policy class, every request"
    if rate < 1.0:
        method = f"kvtier's policy class on a miniature of {rate:.3%} of keys"
    return Curve(name, capacities, hits * per_chunk / total_tokens, 0.0, method)
