"""From an ``Analysis`` to a recommendation: the verdict (don't tier / host tier only / host +
fs), its reasons, ``cpu_bytes_to_use`` and fs ``max_bytes`` at the knees of the curves, the
eviction policy and admission setting, and the predicted share of prompt tokens per tier.

Rules, in order (``options.min_reuse`` = 5%, ``min_gain`` = 2 points, ``knee`` = 95%):

1. less than ``min_reuse`` of prompt tokens repeat an earlier prefix: **don't tier**;
2. host memory is sized at the knee of the LRU curve (the smallest size that reaches 95% of
   what any cache could add to the device pool), capped by the host's headroom and by
   ``options.max_cpu_bytes`` (a warning says which cap bound it);
3. a filesystem tier is sized at the knee of the host + fs curve, capped by ``max_fs_bytes``;
   it is worth adding when it serves ``min_gain`` more of the prompt tokens *and* loading a
   chunk from it is faster than recomputing the chunk;
4. **host + fs** if the fs tier is worth adding; else **host tier only** if host memory adds
   ``min_gain`` over the device pool; else **don't tier** (the device pool already holds the
   working set, or reuse is too far apart for what the host can hold).

ARC and admission are preferred over plain LRU only when they add at least one point at the
recommended size (ARC's figure is read at its nearest simulated capacity below).

Runs on the caller's thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvtier.plan.analysis import FILE_HEADER_BYTES, Analysis
from kvtier.plan.cost import (
    Headroom,
    Throughputs,
    TierCost,
    headroom,
    promotion_pays,
    tier_cost,
)
from kvtier.plan.curves import Curve, capacity_grid, host_level_hits, secondary_needs, stack_curve

DONT_TIER, HOST_ONLY, HOST_AND_FS = "dont_tier", "host_only", "host_and_fs"
VERDICT_TEXT = {
    DONT_TIER: "don't tier",
    HOST_ONLY: "host tier only",
    HOST_AND_FS: "tier: host + fs",
}
ADMISSION_NAME = "second-use (min_reuse=2)"


@dataclass
class Recommendation:
    """The plan's answer; shares are of all prompt tokens of the trace."""

    verdict: str
    reasons: list[str]
    warnings: list[str]
    cpu_bytes_to_use: int
    eviction_policy: str
    admission: str | None
    fs_max_bytes: int | None
    predicted: dict[str, float]
    costs: list[TierCost]
    headroom: Headroom
    rates: Throughputs
    knees: dict[str, int] = field(default_factory=dict)
    fs_curve: Curve | None = None


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def knee(curve: Curve, base: float, fraction: float, start: float = 0) -> int:
    """The smallest capacity (>= ``start``) where ``curve`` adds ``fraction`` of what it can
    add over ``base``; its largest capacity when it never does."""
    top = float(curve.hit.max())
    target = base + fraction * (top - base)
    ok = np.flatnonzero((curve.hit >= target - 1e-12) & (curve.capacities >= start))
    return int(curve.capacities[ok[0]]) if len(ok) else int(curve.capacities[-1])


def lru_knee(a: Analysis, base: float, fraction: float) -> int:
    """The exact smallest LRU capacity (chunks) that adds ``fraction`` of what LRU can add over
    ``base`` (not limited to the curve's grid)."""
    values = np.concatenate([s.distances[s.stream.usable] for s in a.samples])
    weights = np.concatenate([s.weight[s.stream.usable] for s in a.samples])
    finite = np.isfinite(values)
    order = np.argsort(values[finite], kind="stable")
    ordered, served = values[finite][order], np.cumsum(weights[finite][order]) / a.total_tokens
    if not len(served):
        return 1
    target = base + fraction * (served[-1] - base)
    index = min(int(np.searchsorted(served, target - 1e-12)), len(served) - 1)
    return int(ordered[index]) + 1


def host_share(a: Analysis, capacity: int, admission: bool) -> float:
    """Exact share of prompt tokens the device pool and an LRU host tier serve."""
    hosts = a.admitted if admission else a.samples
    served = 0.0
    for sample, host in zip(a.samples, hosts, strict=True):
        hits = host_level_hits(sample, host, a.device_chunks, capacity) & sample.stream.usable
        served += float(sample.weight[hits].sum())
    return served / a.total_tokens


def recommend(a: Analysis, rates: Throughputs) -> Recommendation:
    """Apply the rules of the module docstring."""
    o, chunk = a.options, a.chunk
    device = a.curves["lru"].at(a.device_chunks) if a.device_chunks else 0.0
    host_knee = max(lru_knee(a, device, o.knee), 1)
    with_fs = _sized(
        a,
        rates,
        host_knee,
        device,
        headroom(o.host_memory, o.process_bytes, True, o.page_cache_bytes),
    )
    if with_fs.verdict != HOST_AND_FS:
        with_fs = _sized(
            a, rates, host_knee, device, headroom(o.host_memory, o.process_bytes, False)
        )
        with_fs.fs_max_bytes = None if with_fs.verdict != HOST_AND_FS else with_fs.fs_max_bytes
    if chunk.reuse_share < o.min_reuse:
        with_fs.verdict = DONT_TIER
        with_fs.reasons = _unique_reasons(a)
    with_fs.knees["host_bytes"] = host_knee * a.slot_bytes
    return with_fs


def _unique_reasons(a: Analysis) -> list[str]:
    chunk = a.chunk
    reasons = []
    if chunk.unique_share >= 0.5:
        reasons.append(f"{chunk.unique_share:.0%} of prompts are unique: no tier can help")
    reasons.append(
        f"only {chunk.reuse_share:.1%} of prompt tokens repeat an earlier prefix "
        f"(below {a.options.min_reuse:.0%})"
    )
    return reasons


def _sized(
    a: Analysis, rates: Throughputs, host_knee: int, device: float, room: Headroom
) -> Recommendation:
    o, warnings = a.options, []
    fits = max(1, room.available // a.slot_bytes)
    cap = fits if o.max_cpu_bytes is None else max(1, o.max_cpu_bytes // a.slot_bytes)
    host = min(host_knee, fits, cap)
    if host_knee > fits:
        warnings.append(_headroom_warning(a, room, host_knee, min(fits, host_knee)))
    if min(host_knee, fits) > cap:
        warnings.append(_cap_warning(a, min(host_knee, fits), host))
    policy, admission, host_hit = _policy(a, host)
    fs_curve = _fs_curve(a, host, admission)
    fs_cap = max(1, o.max_fs_bytes // (a.chunk_bytes + FILE_HEADER_BYTES))
    fs_chunks = min(knee(fs_curve, host_hit, o.knee, start=1), fs_cap)
    fs_hit = max(host_hit, fs_curve.at(fs_chunks))
    pays = promotion_pays(a.chunk.chunk_tokens, a.chunk_bytes, rates.fs_read_bps, rates)
    verdict, reasons = _verdict(a, rates, (device, host_hit, fs_hit), pays, (host, fs_chunks))
    shares = {"device": device, "host": host_hit - device}
    if verdict == HOST_AND_FS:
        shares["fs"] = fs_hit - host_hit
    shares = {k: float(v) for k, v in shares.items()}
    shares["recomputed"] = 1.0 - sum(shares.values())
    return Recommendation(
        verdict,
        reasons,
        warnings,
        host * a.slot_bytes,
        policy,
        ADMISSION_NAME if admission else None,
        fs_chunks * (a.chunk_bytes + FILE_HEADER_BYTES) if verdict == HOST_AND_FS else None,
        shares,
        _costs(a, rates, shares, admission),
        room,
        rates,
        {"fs_bytes": fs_chunks * (a.chunk_bytes + FILE_HEADER_BYTES)},
        fs_curve,
    )


def _headroom_warning(a: Analysis, room: Headroom, wanted: int, host: int) -> str:
    lru = a.curves["lru"]
    return (
        f"the knee of the host curve ({size(wanted * a.slot_bytes)}) does not fit: "
        f"{size(room.total)} of host memory minus {size(room.process)} for the serving "
        f"process, {size(room.os)} for the OS and {size(room.page_cache)} of page cache "
        f"leaves {size(room.available)}; recommending {size(host * a.slot_bytes)} "
        f"({lru.at(host):.1%} of prompt tokens served instead of {lru.at(wanted):.1%})"
    )


def _cap_warning(a: Analysis, wanted: int, host: int) -> str:
    lru = a.curves["lru"]
    return (
        f"cpu_bytes_to_use capped at {size(host * a.slot_bytes)} ({a.options.max_cpu_reason}) "
        f"instead of {size(wanted * a.slot_bytes)}: {lru.at(host):.1%} of prompt tokens served "
        f"instead of {lru.at(wanted):.1%}"
    )


def _policy(a: Analysis, host: int) -> tuple[str, bool, float]:
    """(eviction policy, admission, share served by device + host) at ``host`` chunks."""
    plain, admitted = host_share(a, host, False), host_share(a, host, True)
    admission = admitted >= plain + 0.01
    base = admitted if admission else plain
    arc = a.curves["arc_admit" if admission else "arc"]
    below = arc.capacities[arc.capacities <= host]
    if len(below):
        point = int(below[-1])
        same = a.curves["lru_admit" if admission else "lru"]
        gain = arc.at(point) - same.at(point)
        if gain >= 0.01:
            return "arc", admission, min(base + gain, a.chunk.reuse_share)
    return "lru", admission, base


def _fs_curve(a: Analysis, host: int, admission: bool) -> Curve:
    needs = secondary_needs(
        a.samples, a.admitted if admission else a.samples, a.device_chunks, host, admission
    )
    top = max(float(np.max(n[np.isfinite(n)], initial=1.0)) for n in needs)
    grid = np.concatenate([[0], capacity_grid(top)])
    return stack_curve("host + fs (LRU)", a.samples, grid, a.total_tokens, need=needs)


def _verdict(
    a: Analysis,
    rates: Throughputs,
    hits: tuple[float, float, float],
    pays: bool,
    sizes: tuple[int, int],
) -> tuple[str, list[str]]:
    device, host, fs = hits
    o, reach = a.options, a.chunk.reuse_share
    host_bytes, fs_bytes = sizes[0] * a.slot_bytes, sizes[1] * (a.chunk_bytes + FILE_HEADER_BYTES)
    load_ms = (a.chunk_bytes / rates.fs_read_bps + a.chunk_bytes / rates.host_to_device_bps) * 1e3
    compute_ms = a.chunk.chunk_tokens / rates.prefill_tokens_per_s * 1e3
    speed = f"a chunk loads from fs in {load_ms:.1f} ms against {compute_ms:.1f} ms to recompute it"
    if pays and fs - host >= o.min_gain:
        return HOST_AND_FS, [
            f"reuse distances lie between host memory and disk: host memory ({size(host_bytes)}) "
            f"serves {host:.1%} of prompt tokens, adding fs ({size(fs_bytes)}) {fs:.1%}",
            speed,
        ]
    why_not_fs = (
        f"a filesystem tier would add {fs - host:.1%}" if pays else f"fs does not pay: {speed}"
    )
    if host - device >= o.min_gain:
        return HOST_ONLY, [
            f"host memory ({size(host_bytes)}) serves {host:.1%} of prompt tokens against "
            f"{device:.1%} from the device pool alone ({size(o.device_bytes)})",
            why_not_fs,
        ]
    if reach - device < o.min_gain or device >= o.knee * reach:
        return DONT_TIER, [
            f"the working set fits the device pool ({size(o.device_bytes)}): it already serves "
            f"{device:.1%} of prompt tokens, of the {reach:.1%} any cache could",
        ]
    return DONT_TIER, [
        f"reuse is too far apart: host memory ({size(host_bytes)}) adds {host - device:.1%} "
        f"over the device pool and fs up to {size(fs_bytes)} adds {fs - host:.1%}",
        why_not_fs,
    ]


def _costs(
    a: Analysis, rates: Throughputs, shares: dict[str, float], admission: bool
) -> list[TierCost]:
    tokens, chunk = a.total_tokens, a.chunk
    served_chunks = (shares["device"] + shares["host"]) * tokens / chunk.chunk_tokens
    stored = max(0.0, chunk.chunks - served_chunks - (chunk.distinct if admission else 0))
    costs = [
        tier_cost(
            "host",
            shares["host"] * tokens,
            stored,
            chunk.chunk_tokens,
            a.chunk_bytes,
            rates.host_to_device_bps,
            rates,
        )
    ]
    if "fs" in shares:
        costs.append(
            tier_cost(
                "fs",
                shares["fs"] * tokens,
                stored,
                chunk.chunk_tokens,
                a.chunk_bytes,
                rates.fs_read_bps,
                rates,
            )
        )
    return costs
