"""The peer tier over ZeroMQ with and without glibc malloc tunables, in alternating processes.

Each run is a child ``p2p_tier.py --transport zmq`` (CURVE off and on, ``--repeats``
rounds): once as it is, once with ``GLIBC_TUNABLES`` set to ``--tunables``, turn and turn
about, ``--pairs`` times. A process's malloc settings are fixed when it starts, so the two
cannot share a process as the sides of ``p2p_tier.py`` do; alternating whole processes keeps a
changing machine load from favouring either. Per row (chunk size, CURVE): each setting's median
tier GB/s, tier / raw ratio and tier minor faults per GB over its runs, and the median over
pairs of the tier's GB/s with the tunables over without (``kvtier.bench.verdict``). Prints
JSON.

Why: libzmq allocates every received frame with ``malloc`` on its I/O thread, and glibc often
returns the pages of freed frames to the kernel, so the next frames fault them in again. How
often depends on the history of the process, so one process runs fast and the next slow
(``docs/performance/2026-12-07-peer-malloc.md``).

    PYTHONPATH=src .venv/bin/python benchmarks/peer_malloc.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvtier.bench import verdict

#: What ``docs/tiers/peer.md`` recommends: frames up to 32 MiB come from malloc's arenas, and
#: freed memory is given back to the kernel only past 128 MiB at the top of a heap.
TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=134217728"
SETTINGS = ("default", "tunables")


def run(repeats: int, tunables: str | None) -> dict[str, Any]:
    """One child ``p2p_tier.py``'s JSON, with ``GLIBC_TUNABLES`` set to ``tunables`` (or unset)."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    script = Path(__file__).with_name("p2p_tier.py")
    args = [sys.executable, str(script), "--transport", "zmq", "--repeats", str(repeats)]
    out = subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A child's rows by name ("2 MiB, CURVE off")."""
    return {f"{r['chunk_mib']} MiB, CURVE {('off', 'on')[r['curve']]}": r for r in result["rows"]}


def summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per row: each setting's medians, and tunables / default tier GB/s with its interval."""
    out: dict[str, Any] = {}
    for name in rows(runs["default"][0]):
        got = {s: [rows(r)[name] for r in runs[s]] for s in SETTINGS}
        row: dict[str, Any] = {}
        for setting in SETTINGS:
            mid = statistics.median
            row[setting] = {
                "tier_gbps": [r["tier_gbps"] for r in got[setting]],
                "ratio": round(mid(r["ratio"] for r in got[setting]), 3),
                "tier_faults_per_gb": round(mid(r["tier_faults_per_gb"] for r in got[setting])),
            }
        pairs = zip(got["tunables"], got["default"], strict=True)
        found = verdict.interval([t["tier_gbps"] / d["tier_gbps"] for t, d in pairs])
        row["tunables_over_default"] = found.to_json()
        out[name] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6, help="runs with each setting (6)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of each run (5)")
    parser.add_argument("--tunables", default=TUNABLES, help=f"GLIBC_TUNABLES ({TUNABLES})")
    args = parser.parse_args()
    if args.pairs < 1 or args.repeats < 1:
        parser.error("--pairs and --repeats: 1 or more")
    load_start = os.getloadavg()[0]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
    for pair in range(args.pairs):
        order = SETTINGS if pair % 2 == 0 else SETTINGS[::-1]  # who goes first alternates
        for setting in order:
            runs[setting].append(run(args.repeats, args.tunables if setting != "default" else None))
    load = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    report = {"benchmark": "peer_malloc", "tunables": args.tunables, "load": load}
    print(json.dumps(report | {"rows": summary(runs)}, indent=1))


if __name__ == "__main__":
    main()
