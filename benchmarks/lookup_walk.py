"""The manager's lookup walk over a prefix the fs tier holds and host memory does not: µs per
key, on the caller's thread. Prints JSON.

This is the walk ``TieringManager.prefetch`` and ``lookup`` make before promoting (``make
bench``'s host+fs does one per request for the next prompt): ``--keys`` keys held by the fs
tier, evicted from host, then one key no tier holds, where the walk stops. It calls the
promoter's walk itself, which starts nothing, so every repetition sees the same state; each
figure is the best of ``--repeat`` rounds of 200 walks. ``--baseline-pkg NAME`` measures
another copy of kvtier importable as NAME beside it (e.g. the previous commit's ``src/kvtier``
with its imports renamed, as for ``fs_vs_vllm.py``), rounds alternating.

    PYTHONPATH=src .venv/bin/python benchmarks/lookup_walk.py
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

WALKS = 200
HOST_CHUNKS = 64


class Side:
    """A manager of package ``pkg`` whose fs tier holds ``keys`` (not in host), and the keys."""

    def __init__(self, pkg: str, root: Path, keys: int) -> None:
        kv = importlib.import_module(pkg)
        layout = kv.KVLayout(
            num_layers=4, num_kv_heads=2, head_dim=64, dtype="float32", block_size=16,
            blocks_per_chunk=2,
        )  # fmt: skip
        identity = kv.CacheIdentity(model="bench/walk", revision="r1", layout=layout)
        config = {
            "cpu_bytes_to_use": HOST_CHUNKS * layout.chunk_bytes,
            "secondary_tiers": [{"type": "fs", "root_dir": str(root)}],
        }
        self.manager = kv.TieringManager(kv.TieringConfig.from_dict(config), identity)
        self.keys = self._keys(kv, identity, keys, seed=1)
        self._store(self.keys)
        for seed in range(2, 5):  # fills host three times over: the prefix is evicted
            self._store(self._keys(kv, identity, HOST_CHUNKS - 4, seed))
        host = self.manager._promoter.host
        if any(host.state_of(key) is not None for key in self.keys):
            raise SystemExit("lookup_walk: the prefix is still in host memory")
        self.keys += self._keys(kv, identity, 1, seed=99)  # held nowhere: the walk stops

    def _keys(self, kv: Any, identity: Any, count: int, seed: int) -> list[Any]:
        tokens = np.random.default_rng(seed).integers(0, 50_000, count * 32)
        return list(kv.chunk_keys(tokens, identity))

    def _store(self, keys: list[Any]) -> None:
        plan = self.manager.prepare_store(keys)
        self.manager.complete_store(plan.keys, success=True)
        self.manager.wait_idle(30.0)

    def round_us_per_key(self) -> float:
        walk, keys = self.manager._promoter._walk, self.keys
        started = time.perf_counter()
        for _ in range(WALKS):
            walk(keys)
        return (time.perf_counter() - started) / WALKS / len(keys) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=28)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--baseline-pkg", default=None)
    args, load = parser.parse_args(), [round(os.getloadavg()[0], 2)]
    pkgs = ["kvtier"] + ([args.baseline_pkg] if args.baseline_pkg else [])
    with tempfile.TemporaryDirectory(prefix="lookup-walk-") as tmp:
        sides = {pkg: Side(pkg, Path(tmp) / pkg, args.keys) for pkg in pkgs}
        rounds: dict[str, list[float]] = {pkg: [] for pkg in pkgs}
        for _ in range(args.repeat):
            for pkg, side in sides.items():
                rounds[pkg].append(side.round_us_per_key())
        for side in sides.values():
            side.manager.close()
    best = {pkg: round(min(us), 3) for pkg, us in rounds.items()}
    doc: dict[str, Any] = {"benchmark": "lookup_walk", "keys": args.keys, "us_per_key": best}
    if args.baseline_pkg:
        doc["kvtier_over_baseline"] = round(best["kvtier"] / best[args.baseline_pkg], 3)
    print(json.dumps({**doc, "load_average_1m": [*load, round(os.getloadavg()[0], 2)]}, indent=1))


if __name__ == "__main__":
    main()
