"""Filesystem tier throughput next to a raw baseline measured in the same run. Prints JSON.

For chunks of 256 KiB, 2 MiB and 8 MiB, ``--total-mib`` of chunks are stored and then loaded:

* raw: ``--threads`` plain threads, each creating one file per chunk with ``os.pwrite`` and
  reading it back with ``os.preadv`` (open and close included; no header, no checksum);
* tier: a ``FilesystemTier`` with as many read and write threads, one job per thread, so every
  chunk pays the real path: header + xxh3-128 checksum, temporary file + rename, verified load
  straight into the host slot. The two levels of hex directories the chunks land in are created
  before timing, as in a cache in use (creating one costs a ``mkdir``, once per directory).

Buffered rows run page-cache hot (the files were just written; the machine has RAM to spare).
O_DIRECT rows (when the filesystem allows it) compare the tier with ``o_direct: "on"`` against
raw O_DIRECT threads. Each figure is the best of ``--repeats`` rounds, rounds of the two sides
interleaved, each in a fresh directory, after one untimed warm-up round; throughput is chunk
payload bytes per second (GB = 1e9). ``*_cpu_s_per_GB`` is the CPU time of the whole process per
GB moved (best round): on a shared, oversubscribed machine it is steadier than wall time.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from kvtier import CacheIdentity, ChunkKey, KVLayout
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs.config import FsTierConfig
from kvtier.tiers.fs.files import O_DIRECT
from kvtier.tiers.fs.tier import FilesystemTier

SIZES = (256 << 10, 2 << 20, 8 << 20)
IDENTITY = CacheIdentity(model="bench/model", layout=KVLayout(1, 1, 64))


Timing = tuple[float, float]  # (wall seconds, CPU seconds of the whole process)


def timed(fn: Callable[[], None]) -> Timing:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def run_threads(n_threads: int, n_chunks: int, work: Callable[[int], None]) -> Timing:
    """Time ``n_threads`` threads running ``work(i)`` for every chunk index, split evenly."""

    def worker(first: int) -> None:
        for index in range(first, n_chunks, n_threads):
            work(index)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]

    def run() -> None:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    return timed(run)


def raw_round(region: HostRegion, root: Path, n_threads: int, direct: bool) -> list[Timing]:
    """[store, load] timings of plain pwrite/preadv threads, one file per chunk."""
    flags = O_DIRECT if direct else 0
    paths = [str(root / f"chunk-{i}") for i in range(region.num_slots)]

    def view(index: int) -> memoryview:
        return region.aligned_view(index) if direct else region.view(index)

    def write(index: int) -> None:
        fd = os.open(paths[index], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o644)
        try:
            os.pwrite(fd, view(index), 0)
        finally:
            os.close(fd)

    def read(index: int) -> None:
        fd = os.open(paths[index], os.O_RDONLY | flags)
        try:
            os.preadv(fd, [view(index)], 0)
        finally:
            os.close(fd)

    return [run_threads(n_threads, region.num_slots, fn) for fn in (write, read)]


def tier_round(region: HostRegion, root: Path, n_threads: int, direct: bool) -> list[Timing]:
    """[store, load] timings through a FilesystemTier, one job per thread."""
    mode: Literal["on", "off"] = "on" if direct else "off"
    config = FsTierConfig(
        str(root), n_read_threads=n_threads, n_write_threads=n_threads, o_direct=mode
    )
    tier = FilesystemTier(config, region, IDENTITY)
    try:
        tier.wait_scanned()
        keys = [ChunkKey(os.urandom(32)) for _ in range(region.num_slots)]
        for key in keys:  # steady state: a used cache already has its two levels of directories
            os.makedirs(Path(tier.namespace) / key.hex()[:2] / key.hex()[2:4], exist_ok=True)
        jobs = [
            (tuple(keys[t::n_threads]), tuple(range(region.num_slots))[t::n_threads])
            for t in range(n_threads)
        ]
        store = timed(lambda: run_jobs(tier, jobs, tier.submit_store))
        return [store, timed(lambda: run_jobs(tier, jobs, tier.submit_load))]
    finally:
        tier.close()


def run_jobs(tier: FilesystemTier, jobs: list[Any], submit: Callable[[TransferJob], None]) -> None:
    for job_id, (keys, slots) in enumerate(jobs):
        submit(TransferJob(job_id, keys, slots))
    pending = len(jobs)
    while pending:
        results = tier.get_finished_jobs()
        if any(not r.ok for r in results):
            raise RuntimeError(f"a tier job failed: {[r.error for r in results if not r.ok]}")
        pending -= len(results)
        time.sleep(0.001)


def measure(size: int, args: argparse.Namespace, direct: bool) -> dict[str, object]:
    n_chunks = max(args.threads, (args.total_mib << 20) // size)
    region = HostRegion(n_chunks, size, pin=False)
    for slot in range(n_chunks):
        region.numpy(slot)[:] = np.random.default_rng(slot).integers(0, 256, size, dtype=np.uint8)
    best: dict[str, Timing] = {}
    for round_index in range(-1, args.repeats):  # round -1 warms memory and disk up, untimed
        for side, fn in (("raw", raw_round), ("tier", tier_round)):
            root = Path(tempfile.mkdtemp(prefix=f"fs-bench-{side}-", dir=args.dir))
            try:
                timings = fn(region, root, args.threads, direct)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            for op, (wall, cpu) in zip(("store", "load"), timings, strict=True):
                old_wall, old_cpu = best.get(f"{side}_{op}", (1e9, 1e9))
                if round_index >= 0:
                    best[f"{side}_{op}"] = (min(old_wall, wall), min(old_cpu, cpu))
    gbytes = n_chunks * size / 1e9
    gbps = {k: gbytes / wall for k, (wall, _) in best.items()}
    return {
        "chunk_bytes": size,
        "mode": "o_direct" if direct else "buffered (page cache hot)",
        "chunks": n_chunks,
        **{f"{k}_GBps": round(v, 2) for k, v in gbps.items()},
        "store_ratio": round(gbps["tier_store"] / gbps["raw_store"], 3),
        "load_ratio": round(gbps["tier_load"] / gbps["raw_load"], 3),
        **{f"{k}_cpu_s_per_GB": round(cpu / gbytes, 4) for k, (_, cpu) in best.items()},
    }


def o_direct_allowed(directory: str | None) -> bool:
    with tempfile.NamedTemporaryFile(dir=directory) as probe:
        try:
            fd = os.open(probe.name, os.O_RDWR | O_DIRECT)
        except OSError:
            return False
        try:
            return os.pwrite(fd, memoryview(mmap.mmap(-1, 4096)), 0) == 4096
        except OSError:
            return False
        finally:
            os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to write (default: the temp dir)")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--total-mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-o-direct", action="store_true", help="skip the O_DIRECT rows")
    args = parser.parse_args()
    modes = [False] + (
        [True] if O_DIRECT and not args.no_o_direct and o_direct_allowed(args.dir) else []
    )
    results = [measure(size, args, direct) for direct in modes for size in SIZES]
    print(
        json.dumps(
            {
                "benchmark": "fs_tier",
                "directory": args.dir or tempfile.gettempdir(),
                "threads": args.threads,
                "bytes_per_round": args.total_mib << 20,
                "statistic": f"best of {args.repeats} rounds, raw and tier interleaved",
                "tier_level_dirs": "created before timing (steady state)",
                "results": results,
                "cpus": os.cpu_count(),
                "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
                "python": platform.python_version(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
