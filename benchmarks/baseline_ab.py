"""``kvtier bench``'s host+fs against the same strategy of another copy of kvtier. Prints JSON.

The before/after of a change at one N (default 24, where issue 28 asks for 95% of the
ceiling): host+fs of this checkout, host+fs of ``--baseline-pkg NAME`` (another copy of the
package importable as NAME, e.g. the previous commit's ``src/kvtier`` with its imports
renamed, as for ``fs_vs_vllm.py``) and the ceiling take turns request by request, each tiered
side on a directory of its own, so a noisy machine slows them alike. Each package builds its
own copy of the model from the same seed. ``--repeats R`` runs the workload R times (seeds
0..R-1), the sides' order turning each time. Per repeat: each side's throughput over the
ceiling and this checkout's over the baseline's; then their medians.

    PYTHONPATH=src:/tmp/base .venv/bin/python benchmarks/baseline_ab.py --baseline-pkg kvtier_base
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from fs_vs_vllm import report

SIDES = ("kvtier", "baseline", "ceiling")


def start_side(pkg: str, side: str, conversations: int, seed: int, root: Path) -> Any:
    """A ``StrategyRun`` of package ``pkg``: host+fs on ``root / side``, or the ceiling."""
    runner = importlib.import_module(f"{pkg}.bench.runner")
    engine = importlib.import_module(f"{pkg}.bench.engine")
    tiering = importlib.import_module(f"{pkg}.config.schema").TieringConfig
    bench = runner.Bench(runner.BenchOptions(seed=seed, output_dir=str(root)))
    caps = bench.capacities()
    spec = bench.options.spec(conversations, bench.vocab_size)
    if side == "ceiling":
        strategy = engine.Strategy(side, None)
    else:
        fs = {"type": "fs", "root_dir": str(root / side)}
        config = {"cpu_bytes_to_use": caps["host_bytes"], "secondary_tiers": [fs]}
        strategy = engine.Strategy(side, caps["device_chunks"], tiering.from_dict(config))
    return engine.StrategyRun(bench.model, bench.identity, strategy, spec, f"ab-{seed}-{side}")


def one_repeat(args: argparse.Namespace, seed: int, root: Path) -> dict[str, float]:
    """The three sides in turn, request by request; their throughputs' ratios."""
    order = SIDES[seed % 3 :] + SIDES[: seed % 3]
    pkgs = {"kvtier": "kvtier", "baseline": args.baseline_pkg, "ceiling": "kvtier"}
    runs = {side: start_side(pkgs[side], side, args.conversations, seed, root) for side in order}
    try:
        active = list(runs.values())
        while active:
            active = [run for run in active if run.step()]
    finally:
        results = {side: run.close() for side, run in runs.items()}
    tput = {side: result.throughput for side, result in results.items()}
    return {
        "kvtier_of_ceiling": round(tput["kvtier"] / tput["ceiling"], 4),
        "baseline_of_ceiling": round(tput["baseline"] / tput["ceiling"], 4),
        "kvtier_over_baseline": round(tput["kvtier"] / tput["baseline"], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-pkg", required=True)
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    args.dir = None
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="baseline-ab-") as tmp:
        repeats = [one_repeat(args, seed, Path(tmp) / str(seed)) for seed in range(args.repeats)]
    fields = {
        "baseline": args.baseline_pkg,
        "conversations": args.conversations,
        "repeats": repeats,
        "median": {k: statistics.median(r[k] for r in repeats) for k in repeats[0]},
    }
    print(report("baseline_ab", args, load_before, fields))


if __name__ == "__main__":
    main()
