"""A workload with and without glibc malloc tunables, in alternating processes. Prints JSON.

Each run is a child process: once as it is, once with ``GLIBC_TUNABLES`` set to
``--tunables``, turn and turn about, ``--pairs`` times. A process's malloc settings are fixed
when it starts, so the two cannot share a process; alternating whole processes keeps a
changing machine load from favouring either. ``--workload``:

* ``peer``: ``p2p_tier.py --transport zmq`` (CURVE off and on, ``--repeats`` rounds). Per row
  (chunk size, CURVE), each setting's tier GB/s (every run), median tier / raw pyzmq ratio and
  median tier faults per GB, and the median over pairs of the tier's GB/s with the tunables
  over without;
* ``bench``: ``kvtier bench --conversations 24`` (the transformers engine, every strategy).
  Each setting's host+fs throughput over the ceiling's (every run), and the median over pairs
  of that fraction with the tunables over without.

Intervals: ``kvtier.bench.verdict`` (95 %; 6 pairs at least for one, and with 6 it spans the
lowest to the highest pair).

Why: libzmq allocates every received frame with ``malloc``, and an engine built on transformers
allocates tensors for every request; glibc often gives freed pages back to the kernel, and
the next allocations fault them in again (``docs/performance/2026-12-07-peer-malloc.md``,
``docs/operating.md#memory-allocator``).

    PYTHONPATH=src .venv/bin/python benchmarks/malloc_ab.py --workload peer
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtier.bench import verdict

#: What ``docs/operating.md`` recommends: blocks up to 32 MiB come from malloc's heaps, and
#: freed memory is given back to the kernel only past 128 MiB at the top of a heap.
TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=134217728"
SETTINGS = ("default", "tunables")
Rows = dict[str, dict[str, float]]  # a run's figures by row name


def child(args: list[str], tunables: str | None) -> str:
    """The stdout of ``args`` run with ``GLIBC_TUNABLES`` set to ``tunables`` (or unset)."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    return subprocess.run(args, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout


def peer_run(repeats: int, tunables: str | None) -> Rows:
    """One ``p2p_tier.py`` process: its rows by name ("2 MiB, CURVE off")."""
    script = Path(__file__).with_name("p2p_tier.py")
    args = [sys.executable, str(script), "--transport", "zmq", "--repeats", str(repeats)]
    rows = json.loads(child(args, tunables))["rows"]
    return {
        f"{r['chunk_mib']} MiB, CURVE {('off', 'on')[r['curve']]}": {
            "value": r["tier_gbps"],
            "ratio": r["ratio"],
            "faults_per_gb": r["tier_faults_per_gb"],
        }
        for r in rows
    }


def bench_run(repeats: int, tunables: str | None) -> Rows:
    """One ``kvtier bench`` process at 24 conversations: host+fs over the ceiling."""
    with tempfile.TemporaryDirectory() as folder:
        args = [sys.executable, "-m", "kvtier.cli", "bench", "--conversations", "24"]
        child([*args, "--no-progress", "--output-dir", folder], tunables)
        headline = json.loads((Path(folder) / "bench.json").read_text())["headline"]
    return {"host+fs over the ceiling, N=24": {"value": headline["fraction_of_ceiling"]}}


WORKLOADS: dict[str, Callable[[int, str | None], Rows]] = {"peer": peer_run, "bench": bench_run}


def summary(runs: dict[str, list[Rows]]) -> dict[str, Any]:
    """Per row: each setting's values and the medians of its other figures; tunables over
    default (``value``), pair by pair, with its interval."""
    out: dict[str, Any] = {}
    for name in runs["default"][0]:
        got = {s: [r[name] for r in runs[s]] for s in SETTINGS}
        row: dict[str, Any] = {}
        for setting in SETTINGS:
            row[setting] = {"value": [r["value"] for r in got[setting]]}
            for figure in sorted(set(got[setting][0]) - {"value"}):
                row[setting][figure] = statistics.median(r[figure] for r in got[setting])
        pairs = zip(got["tunables"], got["default"], strict=True)
        found = verdict.interval([t["value"] / d["value"] for t, d in pairs])
        row["tunables_over_default"] = found.to_json()
        out[name] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="peer")
    parser.add_argument("--pairs", type=int, default=6, help="runs with each setting (6)")
    parser.add_argument("--repeats", type=int, default=5, help="peer: rounds of each run (5)")
    parser.add_argument("--tunables", default=TUNABLES, help=f"GLIBC_TUNABLES ({TUNABLES})")
    args = parser.parse_args()
    if args.pairs < 1 or args.repeats < 1:
        parser.error("--pairs and --repeats: 1 or more")
    load_start = os.getloadavg()[0]
    runs: dict[str, list[Rows]] = {s: [] for s in SETTINGS}
    for pair in range(args.pairs):
        order = SETTINGS if pair % 2 == 0 else SETTINGS[::-1]  # who goes first alternates
        for setting in order:
            tunables = args.tunables if setting == "tunables" else None
            runs[setting].append(WORKLOADS[args.workload](args.repeats, tunables))
    load = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    head = {"benchmark": "malloc_ab", "workload": args.workload, "tunables": args.tunables}
    print(json.dumps(head | {"load": load, "rows": summary(runs)}, indent=1))


if __name__ == "__main__":
    main()
