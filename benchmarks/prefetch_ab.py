"""``kvtier bench``'s host+fs with and without ``TieredModel.prefetch``, side by side. Prints JSON.

Three strategies take turns request by request, as ``kvtier bench`` interleaves its own (so a
noisy machine slows them alike): host+fs handing the next request's prompt to ``prefetch``,
host+fs without, each on a filesystem directory of its own, and the ceiling. ``--repeats R``
runs the workload R times with seeds 0..R-1. Per repeat: each side's throughput over the
ceiling, prefetch over no prefetch, and the follow-up turns' TTFT p50; then their medians.

    PYTHONPATH=src .venv/bin/python benchmarks/prefetch_ab.py --conversations 24 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from kvtier.bench.engine import RunResult, Strategy, StrategyRun
from kvtier.bench.runner import Bench, BenchOptions, take_turns
from kvtier.config.schema import TieringConfig

SIDES = ("prefetch", "no-prefetch", "ceiling")


def one_repeat(conversations: int, seed: int, root: Path) -> dict[str, Any]:
    bench = Bench(BenchOptions(seed=seed, output_dir=str(root)))
    caps = bench.capacities()

    def tiered(name: str) -> Strategy:
        fs = {"type": "fs", "root_dir": str(root / name)}
        config = {"cpu_bytes_to_use": caps["host_bytes"], "secondary_tiers": [fs]}
        return Strategy(name, caps["device_chunks"], TieringConfig.from_dict(config))

    strategies = [tiered(SIDES[0]), tiered(SIDES[1]), Strategy(SIDES[2], None)]
    spec = bench.options.spec(conversations, bench.vocab_size)

    def start(strategy: Strategy) -> StrategyRun:
        prefetch = strategy.name == SIDES[0]
        salt = f"prefetch-ab-{seed}-{strategy.name}"
        return StrategyRun(bench.model, bench.identity, strategy, spec, salt, prefetch=prefetch)

    results = take_turns([lambda s=s: start(s) for s in strategies], None)
    return summary({r.strategy: r for r in results})


def summary(by: dict[str, RunResult]) -> dict[str, Any]:
    ceiling = by[SIDES[2]].throughput
    out: dict[str, Any] = {
        f"{side}_of_ceiling": round(by[side].throughput / ceiling, 4) for side in SIDES[:2]
    }
    out["prefetch_over_no_prefetch"] = round(by[SIDES[0]].throughput / by[SIDES[1]].throughput, 4)
    for side in SIDES:
        out[f"{side}_follow_up_ttft_p50_ms"] = round(
            1000 * statistics.median(by[side].follow_up_ttft_s), 2
        )
        out[f"{side}_sources"] = dict(by[side].follow_up_sources)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="prefetch-ab-") as tmp:
        root = Path(tmp)
        repeats = [one_repeat(args.conversations, s, root / str(s)) for s in range(args.repeats)]
    keys = ("prefetch_of_ceiling", "no-prefetch_of_ceiling", "prefetch_over_no_prefetch")
    doc = {
        **header(args.conversations, load_before),
        "repeats": repeats,
        "median": {k: statistics.median(r[k] for r in repeats) for k in keys},
    }
    print(json.dumps(doc, indent=1))


def header(conversations: int, load_before: float) -> dict[str, Any]:
    """What a run's JSON starts with: the commit, the conversations, and the 1-minute load
    average at the start (``load_before``) and now."""
    return {
        "commit": _commit(),
        "conversations": conversations,
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    main()
