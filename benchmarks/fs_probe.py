"""How long the lookup of a prompt that ends in new chunks takes to settle, over the fs tier.

A follow-up turn's prompt is the conversation so far (chunks the tier holds) plus the new
user turn: chunks no one has stored. The manager asks the fs tier about the first new one, and
the engine cannot go on until it knows. Sides, each a ``TieringManager`` over an fs tier in
its own directory on the same disk:

* ``inline``: ``probe: "inline"`` (what ``auto`` takes on a local file system): the ``stat``
  runs in the lookup itself;
* ``background``: ``probe: "background"``: the lookup answers ``RETRY``, a probe thread stats,
  and the engine waits with ``wait_progress``, as every engine adapter does.

Each round looks up ``--prompts`` prompts per side (fresh keys each: ``--held`` chunks in host
memory, then 2 new ones), the sides interleaved, and times each from the first ``lookup`` to
the settled answer. Prints JSON: per side the median and p90 in microseconds over all rounds,
and ``background_over_inline`` (above 1: inline settles sooner).

    PYTHONPATH=src .venv/bin/python benchmarks/fs_probe.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fs_vs_vllm import report

from kvtier import CacheIdentity, KVLayout, TieringConfig, TieringManager, chunk_keys
from kvtier.tiers.base import RETRY
from kvtier.tiers.fs.tier import FilesystemTier

SIDES = ("inline", "background")


def manager(root: Path, probe: str, identity: CacheIdentity, held: int) -> TieringManager:
    stride = -(-identity.layout.chunk_bytes // 4096) * 4096
    fs = {"type": "fs", "root_dir": str(root / probe), "probe": probe}
    slots = 2 * held + 8
    config = TieringConfig.from_dict({"cpu_bytes_to_use": slots * stride, "secondary_tiers": [fs]})
    m = TieringManager(config, identity)
    tier = m.tiers[0]
    assert isinstance(tier, FilesystemTier) and tier.wait_scanned(30)
    return m


def held_prompt(m: TieringManager, identity: CacheIdentity, held: int, seed: int) -> list[Any]:
    """Keys of a prompt whose first ``held`` chunks are ready in host memory, then 2 new."""
    tokens_per_chunk = identity.layout.tokens_per_chunk
    tokens = [(seed * 7919 + i) % 50_000 for i in range((held + 2) * tokens_per_chunk)]
    keys = chunk_keys(tokens, identity)
    plan = m.prepare_store(keys[:held])
    assert plan is not None
    m.complete_store(plan.keys)
    return keys


def settle(m: TieringManager, keys: list[Any]) -> float:
    """Seconds from the first lookup of ``keys`` to a settled answer (the engines' loop)."""
    started = time.perf_counter()
    while m.lookup(keys) is RETRY:
        m.wait_progress(5.0)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=200, help="prompts per side per round")
    parser.add_argument("--held", type=int, default=24, help="chunks of each prompt in host")
    parser.add_argument("--dir", help="where the tiers' directories go (a temporary one)")
    args = parser.parse_args()
    load_before = [round(x, 2) for x in os.getloadavg()]
    layout = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, block_size=16)
    identity = CacheIdentity(model="bench/fs-probe", layout=layout)
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        managers = {side: manager(Path(root), side, identity, args.held) for side in SIDES}
        seed = 0
        for _ in range(args.rounds):
            for _ in range(args.prompts):
                for side in SIDES:
                    seed += 1
                    m = managers[side]
                    keys = held_prompt(m, identity, args.held, seed)
                    times[side].append(settle(m, keys))
        stats = {side: managers[side].tiers[0].stats() for side in SIDES}
        for m in managers.values():
            m.close()
    figures = {
        side: {
            "median_us": round(statistics.median(ts) * 1e6, 1),
            "p90_us": round(sorted(ts)[int(0.9 * len(ts))] * 1e6, 1),
            "probe_misses": stats[side].get("probe_misses", 0),
        }
        for side, ts in times.items()
    }
    ratio = figures["background"]["median_us"] / figures["inline"]["median_us"]
    fields = {"settle": figures, "background_over_inline": round(ratio, 2), **vars(args)}
    print(report("fs_probe", args, load_before, fields))


if __name__ == "__main__":
    main()
