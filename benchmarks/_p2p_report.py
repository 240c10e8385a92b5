"""The JSON of ``p2p_tier.py``: each side's GB/s, the tier / raw ratios with their intervals,
and page faults per GB (see that script's docstring for what each side is)."""

from __future__ import annotations

import statistics
from typing import Any

from kvtier.bench import verdict

#: The JSON name of the tier side over each transport (``tier``: ZeroMQ, as before 2026-12-05).
TIER_SIDE = {"zmq": "tier", "tcp": "tier_tcp"}


def summary(payload: int, rounds: list[dict[str, float]]) -> dict[str, Any]:
    """Medians (and, for raw and each tier, bests) of each side's GB/s; ``ratio`` and
    ``ratio_into_slots`` (``tcp_ratio``...: the tier over TCP): the median of each round's
    tier / raw (raw into slots) throughput ratio, so that load that changes between rounds
    cancels out; ``ratio_interval`` (...): that median's 95 % interval (``kvtier.bench.verdict``,
    6 rounds at least), to read against an aim such as 0.8x raw."""
    mid = statistics.median
    gbps: dict[str, float] = {}
    ratios: dict[str, Any] = {}
    for side in rounds[0]:
        seconds = [r[side] for r in rounds]
        gbps[f"{side}_gbps"] = round(payload / mid(seconds) / 1e9, 3)
        if side != "raw_into_slots":
            gbps[f"{side}_best_gbps"] = round(payload / min(seconds) / 1e9, 3)
        if side == "tier_server":
            found = verdict.interval([r["raw"] / r[side] for r in rounds])
            ratios |= {
                "server_ratio": round(found.median, 3),
                "server_ratio_interval": found.to_json(),
            }
        elif side.startswith("tier"):
            prefix = "" if side == "tier" else "tcp_"
            for name, base in (("ratio", "raw"), ("ratio_into_slots", "raw_into_slots")):
                found = verdict.interval([r[base] / r[side] for r in rounds])
                ratios[f"{prefix}{name}"] = round(found.median, 3)
                ratios[f"{prefix}{name}_interval"] = found.to_json()
    return gbps | ratios


def faults_per_gb(payload: int, faults: list[dict[str, float]]) -> dict[str, int]:
    """The median minor page faults of this process (all its threads) per GB a side received
    (``SIDE_faults_per_gb``); see the module docstring."""
    return {
        f"{side}_faults_per_gb": round(statistics.median(r[side] for r in faults) * 1e9 / payload)
        for side in faults[0]
    }
