"""A workload with kvtier's malloc settings and without, in alternating processes. Prints JSON.

kvtier sets glibc malloc's thresholds once per process at start (``tune_malloc``, on by
default: ``kvtier.core.malloc_settings``). Each run here is a child process, once with the
settings (``on``) and once with ``tune_malloc`` false (``off``: malloc as glibc starts), turn and
turn about, ``--pairs`` times. A process's malloc settings stay once made, so the two cannot
share a process; alternating whole processes keeps a changing machine load from favouring either.
``--workload``:

* ``peer``: ``p2p_tier.py --transport zmq`` (CURVE off and on, ``--repeats`` rounds;
  ``--no-tune-malloc`` for ``off``). Per row (chunk size, CURVE), each setting's tier GB/s
  (every run), median tier / raw pyzmq ratio (raw pyzmq in the same process, under the same
  settings) and median tier faults per GB, and the median over pairs of the tier's GB/s on over
  off;
* ``bench``: ``kvtier bench --conversations 24`` (the transformers engine, every strategy;
  ``off`` runs with a ``--config`` of the default's host memory and fs tier, with
  ``tune_malloc: false``). Each setting's host+fs throughput over the ceiling's (every run),
  and the median over pairs of that fraction on over off.

Intervals: ``kvtier.bench.verdict`` (95 %; 6 pairs at least for one, and with 6 it spans the
lowest to the highest pair). ``GLIBC_TUNABLES`` and ``MALLOC_*_`` are removed from the children's
environment: with them, the operator's settings would win on both sides.

Why: libzmq allocates every received frame with ``malloc``, and an engine built on transformers
allocates tensors for every request; glibc gives freed pages back to the kernel early until the
process has freed a large block, and the next allocations fault them in again
(``docs/performance/2026-12-07-peer-malloc.md``, ``docs/operating.md#memory-allocator``).

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

SETTINGS = ("on", "off")
Rows = dict[str, dict[str, float]]  # a run's figures by row name


def child(args: list[str]) -> str:
    """The stdout of ``args``, run without the operator's malloc settings."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and k[:7] != "MALLOC_"}
    return subprocess.run(args, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout


def peer_run(repeats: int, setting: str) -> Rows:
    """One ``p2p_tier.py`` process: its rows by name ("2 MiB, CURVE off")."""
    script = Path(__file__).with_name("p2p_tier.py")
    args = [sys.executable, str(script), "--transport", "zmq", "--repeats", str(repeats)]
    out = json.loads(child([*args, "--tune-malloc" if setting == "on" else "--no-tune-malloc"]))
    assert out["tune_malloc"] == ("set" if setting == "on" else "off"), out["tune_malloc"]
    return {
        f"{r['chunk_mib']} MiB, CURVE {('off', 'on')[r['curve']]}": {
            "value": r["tier_gbps"],
            "ratio": r["ratio"],
            "faults_per_gb": r["tier_faults_per_gb"],
        }
        for r in out["rows"]
    }


class BenchRuns:
    """``kvtier bench`` processes at 24 conversations: host+fs over the ceiling.

    ``off`` needs the host memory the default gives, read from an ``on`` run's JSON (the first
    run of the first pair is ``on``)."""

    def __init__(self) -> None:
        self.host_bytes: int | None = None

    def __call__(self, repeats: int, setting: str) -> Rows:
        with tempfile.TemporaryDirectory() as folder:
            args = [sys.executable, "-m", "kvtier.cli", "bench", "--conversations", "24"]
            args += ["--no-progress", "--output-dir", folder]
            if setting == "off":
                args += ["--config", self.off_config(Path(folder))]
            child(args)
            out = json.loads((Path(folder) / "bench.json").read_text())
        self.host_bytes = out["capacities"]["host_bytes"]
        fraction = out["headline"]["fraction_of_ceiling"]
        return {"host+fs over the ceiling, N=24": {"value": fraction}}

    def off_config(self, folder: Path) -> str:
        assert self.host_bytes is not None, "an on run comes first"
        config = {
            "cpu_bytes_to_use": self.host_bytes,
            "secondary_tiers": [{"type": "fs", "root_dir": str(folder / "fs")}],
            "tune_malloc": False,
        }
        path = folder / "off.json"
        path.write_text(json.dumps(config))
        return str(path)


def workloads() -> dict[str, Callable[[int, str], Rows]]:
    return {"peer": peer_run, "bench": BenchRuns()}


def summary(runs: dict[str, list[Rows]]) -> dict[str, Any]:
    """Per row: each setting's values and the medians of its other figures; on over off
    (``value``), pair by pair, with its interval."""
    out: dict[str, Any] = {}
    for name in runs["on"][0]:
        got = {s: [r[name] for r in runs[s]] for s in SETTINGS}
        row: dict[str, Any] = {}
        for setting in SETTINGS:
            row[setting] = {"value": [r["value"] for r in got[setting]]}
            for figure in sorted(set(got[setting][0]) - {"value"}):
                row[setting][figure] = statistics.median(r[figure] for r in got[setting])
        pairs = zip(got["on"], got["off"], strict=True)
        row["on_over_off"] = verdict.interval([a["value"] / b["value"] for a, b in pairs]).to_json()
        out[name] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("peer", "bench"), default="peer")
    parser.add_argument("--pairs", type=int, default=6, help="runs with each setting (6)")
    parser.add_argument("--repeats", type=int, default=5, help="peer: rounds of each run (5)")
    args = parser.parse_args()
    if args.pairs < 1 or args.repeats < 1:
        parser.error("--pairs and --repeats: 1 or more")
    run = workloads()[args.workload]
    load_start = os.getloadavg()[0]
    runs: dict[str, list[Rows]] = {s: [] for s in SETTINGS}
    for pair in range(args.pairs):
        for setting in SETTINGS if pair % 2 == 0 else SETTINGS[::-1]:  # who goes first alternates
            runs[setting].append(run(args.repeats, setting))
    load = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    head = {"benchmark": "malloc_ab", "workload": args.workload}
    print(json.dumps(head | {"load": load, "rows": summary(runs)}, indent=1))


if __name__ == "__main__":
    main()
