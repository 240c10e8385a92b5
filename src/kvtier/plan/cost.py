"""The cost side of a plan: tier throughputs (assumed, measured, or from a bench JSON), what
each tier saves against the bytes it moves, and how much host memory is really free.

Throughputs:

* ``DEFAULTS``: assumed figures (one modern accelerator, PCIe pinned copies, one NVMe disk);
* ``calibrate_fs(dir)``: stores then loads a few chunks through a real ``FilesystemTier`` on
  this machine (a few seconds; loads are page-cache hot, so they are an upper bound);
* ``from_bench_json(path)``: a ``kvtier bench`` JSON (``bench-results/bench.json``): prefill
  rate from the ``recompute`` rows, and the effective promotion throughput of the storage
  tier from the largest N (bytes it served over the time the run took beyond the ceiling).
  Both describe the bench's own model on the bench's machine.

Runs on the caller's thread (the filesystem tier uses its own I/O threads while measuring).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

GiB = 1 << 30


class PlanInputError(ValueError):
    """An input of the plan (a bench JSON, a calibration directory) that cannot be used."""


@dataclass(frozen=True)
class Throughputs:
    """Rates the cost model uses: prefill (tokens/s) and tier transfers (bytes/s)."""

    prefill_tokens_per_s: float = 10_000.0
    host_to_device_bps: float = 20e9
    fs_read_bps: float = 2e9
    fs_write_bps: float = 1e9
    source: str = "assumed defaults"


DEFAULTS = Throughputs()


def calibrate_fs(base: Throughputs, chunk_bytes: int, directory: str | None) -> Throughputs:
    """``base`` with the filesystem tier's store and load rates measured under ``directory``
    (the temp dir by default): up to 64 chunks of at most 8 MiB, 4 threads."""
    size = max(4096, min(chunk_bytes, 8 << 20))
    count = max(8, min(64, (256 << 20) // size))
    try:
        root = Path(tempfile.mkdtemp(prefix="kvtier-calibrate-", dir=directory))
    except OSError as exc:
        raise PlanInputError(f"--calibrate-dir {directory}: {exc.strerror or exc}") from None
    try:
        write_s, read_s = _measure_fs(root, size, count)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    moved = size * count
    where = directory or tempfile.gettempdir()
    return replace(
        base,
        fs_read_bps=moved / read_s,
        fs_write_bps=moved / write_s,
        source=f"{base.source}; fs tier measured in {where} (loads page-cache hot)",
    )


def _measure_fs(root: Path, size: int, count: int) -> tuple[float, float]:
    from kvtier import CacheIdentity, ChunkKey, KVLayout
    from kvtier.region import HostRegion
    from kvtier.tiers.base import TransferJob
    from kvtier.tiers.fs.config import FsTierConfig
    from kvtier.tiers.fs.tier import FilesystemTier

    region = HostRegion(count, size, pin=False)
    for slot in range(count):
        region.view(slot)[:] = os.urandom(size)
    config = FsTierConfig(str(root), n_read_threads=4, n_write_threads=4, o_direct="off")
    tier = FilesystemTier(
        config, region, CacheIdentity(model="kvtier/plan", layout=KVLayout(1, 1, 64))
    )
    try:
        tier.wait_scanned(10)
        keys = [ChunkKey(os.urandom(32)) for _ in range(count)]
        jobs = [TransferJob(t, tuple(keys[t::4]), tuple(range(count))[t::4]) for t in range(4)]
        return _timed_jobs(tier, jobs, tier.submit_store), _timed_jobs(tier, jobs, tier.submit_load)
    finally:
        tier.close()


def _timed_jobs(tier: Any, jobs: list[Any], submit: Any) -> float:
    started = time.perf_counter()
    for job in jobs:
        submit(job)
    pending, deadline = len(jobs), started + 60
    while pending:
        results = tier.get_finished_jobs()
        if any(not r.ok for r in results):
            raise PlanInputError("calibration: the filesystem tier failed a job")
        pending -= len(results)
        if time.perf_counter() > deadline:
            raise PlanInputError("calibration: the filesystem tier took over 60 s")
        time.sleep(0.0005)
    return max(1e-6, time.perf_counter() - started)


def from_bench_json(base: Throughputs, path: str) -> Throughputs:
    """``base`` with the prefill and storage-tier rates of a ``kvtier bench`` JSON."""
    try:
        document = json.loads(_read_regular(path, MAX_BENCH_JSON_BYTES))
        rows, caps = document["results"], document["capacities"]
        bytes_per_token = caps["chunk_bytes"] / caps["chunk_tokens"]
        prefill = _prefill_rate(rows)
        storage = _storage_rate(rows, document["strategies"], bytes_per_token)
    except PlanInputError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise PlanInputError(f"bench JSON {path}: {reason}") from None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, ArithmeticError) as exc:
        raise PlanInputError(f"bench JSON {path}: not a kvtier bench result ({exc!r})") from None
    except RecursionError:  # JSON nested deeper than the parser's recursion
        raise PlanInputError(f"bench JSON {path}: not a kvtier bench result (too deep)") from None
    result = replace(base, prefill_tokens_per_s=prefill, source=f"bench JSON {path}")
    return replace(result, fs_read_bps=storage) if storage else result


#: A kvtier bench JSON is a few KiB; anything past this is not one.
MAX_BENCH_JSON_BYTES = 64 << 20


def _read_regular(path: str, limit: int) -> bytes:
    """Up to ``limit`` bytes of regular file ``path``; ``PlanInputError`` for anything else (a
    FIFO would block, a device never end) or a longer file; ``OSError`` when it cannot be read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PlanInputError(f"bench JSON {path}: not a regular file")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise PlanInputError(f"bench JSON {path}: larger than {limit >> 20} MiB")
    return data


def _prefill_rate(rows: list[dict[str, Any]]) -> float:
    recompute = [r for r in rows if r["strategy"] == "recompute"]
    rate = float(max(recompute, key=lambda r: r["conversations"])["throughput_tok_s"])
    if not rate > 0:
        raise ValueError("recompute throughput is not positive")
    return rate


def _storage_rate(rows: list[dict[str, Any]], strategies: list[str], per_token: float) -> float:
    largest = max(r["conversations"] for r in rows)
    at = {r["strategy"]: r for r in rows if r["conversations"] == largest}
    tiered, ceiling = at.get(strategies[2]), at.get("ceiling")
    if tiered is None or ceiling is None:
        return 0.0
    sources = {
        k: v
        for k, v in tiered["prompt_tokens_from"].items()
        if k not in ("accelerator", "host", "recomputed")
    }
    extra_s = float(tiered["seconds"]) - float(ceiling["seconds"])
    moved = sum(sources.values()) * per_token
    return moved / extra_s if extra_s > 0 and moved > 0 else 0.0


@dataclass(frozen=True)
class Headroom:
    """Host memory: ``total`` minus the serving process, the OS and (with a storage tier) the
    page cache leaves ``available`` for ``cpu_bytes_to_use``."""

    total: int
    process: int
    os: int
    page_cache: int

    @property
    def available(self) -> int:
        return max(0, self.total - self.process - self.os - self.page_cache)


def headroom(
    total: int | None, process: int, with_storage_tier: bool, page_cache: int | None = None
) -> Headroom:
    """The headroom of a host of ``total`` bytes (this machine's when ``None``)."""
    from kvtier.config.checks import physical_memory_bytes

    memory = total if total is not None else physical_memory_bytes() or 16 * GiB
    os_bytes = max(GiB, memory // 20)
    cache = 0
    if with_storage_tier:
        cache = page_cache if page_cache is not None else min(8 * GiB, memory // 10)
    return Headroom(memory, process, os_bytes, cache)


@dataclass(frozen=True)
class TierCost:
    """What one tier does over the trace: prompt tokens it serves, bytes it reads and writes,
    prefill time it saves and transfer time it costs (seconds, summed over the trace)."""

    tier: str
    tokens_saved: float
    bytes_read: float
    bytes_written: float
    prefill_saved_s: float
    transfer_s: float

    @property
    def net_saved_s(self) -> float:
        return self.prefill_saved_s - self.transfer_s


def tier_cost(
    tier: str,
    tokens: float,
    chunks_written: float,
    chunk_tokens: int,
    chunk_bytes: int,
    read_bps: float,
    rates: Throughputs,
) -> TierCost:
    """The cost line of a tier serving ``tokens`` and storing ``chunks_written`` chunks."""
    read = tokens / chunk_tokens * chunk_bytes
    return TierCost(
        tier,
        tokens,
        read,
        chunks_written * chunk_bytes,
        tokens / rates.prefill_tokens_per_s,
        read / read_bps,
    )


def promotion_pays(
    chunk_tokens: int, chunk_bytes: int, read_bps: float, rates: Throughputs
) -> bool:
    """Whether loading a chunk at ``read_bps`` (then copying it to the accelerator) is faster
    than recomputing it."""
    load_s = chunk_bytes / read_bps + chunk_bytes / rates.host_to_device_bps
    return load_s < chunk_tokens / rates.prefill_tokens_per_s
