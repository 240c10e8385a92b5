"""Object store tier throughput next to the raw client, against one local S3 server. Prints JSON.

A moto S3 server runs in its own process on 127.0.0.1 (``moto[server]``, objects in its RAM).

* ``clients``: obstore against boto3 doing the same plain puts and gets (one request per object,
  ``--concurrency`` threads): the measurement behind the tier's choice of client. Besides MB/s
  (bounded by the Python server) it gives the client's own CPU seconds per GB moved, which does
  not depend on the server. boto3 is given its best case (checksums only when required; a
  connection pool as large as the concurrency).
* ``tier``: for 2 MiB and 8 MiB chunks, ``--total-mib`` of chunks stored and then loaded through an
  ``ObjectStoreTier`` with ``io_threads = --concurrency`` (one job of every chunk: header and
  xxh3-128 checksum, verified streaming load into the host slots), next to the raw obstore client
  putting and getting objects of the same size with as many threads.

Rounds of the raw client and the tier alternate. Each throughput is the best of ``--repeats``
rounds; the tier's ratio to raw is given as the ratio of the bests and as the median over rounds of
the ratio within a round (steadier on a shared machine). Throughput counts chunk payload bytes
(MB = 1e6).
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import numpy as np
import obstore
from botocore.config import Config
from obstore.store import S3Store

from kvtier import CacheIdentity, ChunkKey, KVLayout
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.s3.config import ObjTierConfig
from kvtier.tiers.s3.tier import ObjectStoreTier
from kvtier.tiers.shared.codec import HEADER_BYTES

SIZES = (2 << 20, 8 << 20)
BUCKET, ACCESS, SECRET = "bench", "bench-access", "bench-secret"


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT"))
            return proc, endpoint
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto server did not start")


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_all(threads: int, fn: Callable[[int], object], n: int) -> None:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, range(n)))


class Raw:
    """Plain puts and gets of ``n`` objects of ``size`` bytes with each client."""

    def __init__(self, endpoint: str, threads: int) -> None:
        self.threads = threads
        self.obstore = S3Store(
            BUCKET,
            endpoint=endpoint,
            region="us-east-1",
            access_key_id=ACCESS,
            secret_access_key=SECRET,
            client_options={"allow_http": True},
        )
        self.boto3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=ACCESS,
            aws_secret_access_key=SECRET,
            config=Config(
                max_pool_connections=max(10, threads),
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def obstore_put(self, data: bytes, n: int) -> float:
        put = lambda i: obstore.put(self.obstore, f"raw/{i}", data, use_multipart=False)  # noqa: E731
        return timed(lambda: run_all(self.threads, put, n))

    def obstore_get(self, n: int) -> float:
        get = lambda i: obstore.get(self.obstore, f"raw/{i}").bytes()  # noqa: E731
        return timed(lambda: run_all(self.threads, get, n))

    def boto3_put(self, data: bytes, n: int) -> float:
        put = lambda i: self.boto3.put_object(Bucket=BUCKET, Key=f"boto/{i}", Body=data)  # noqa: E731
        return timed(lambda: run_all(self.threads, put, n))

    def boto3_get(self, n: int) -> float:
        get = lambda i: self.boto3.get_object(Bucket=BUCKET, Key=f"boto/{i}")["Body"].read()  # noqa: E731
        return timed(lambda: run_all(self.threads, get, n))


def layout_of(size: int) -> KVLayout:
    """A layout whose chunk is exactly ``size`` bytes (1 MiB per layer: 16 blocks of 64 KiB)."""
    return KVLayout(
        num_layers=size >> 20,
        num_kv_heads=8,
        head_dim=128,
        dtype="float16",
        block_size=16,
        blocks_per_chunk=16,
    )


def tier_rounds(endpoint: str, size: int, n: int, threads: int) -> tuple[float, float]:
    """Seconds to store then load ``n`` chunks through a fresh tier (no remembered hits)."""
    identity = CacheIdentity(model="bench/model", layout=layout_of(size))
    assert identity.layout.chunk_bytes == size
    region = HostRegion(2 * n, size)
    rng = np.random.default_rng(size)
    for slot in range(n):
        region.numpy(slot)[:] = rng.integers(0, 256, size, dtype=np.uint8)
        region.numpy(n + slot)[:] = 0  # touched, as a long-lived host region is
    keys = tuple(ChunkKey(rng.bytes(32)) for _ in range(n))
    config = ObjTierConfig(
        bucket=BUCKET,
        endpoint_override=endpoint,
        access_key=ACCESS,
        secret_key=SECRET,
        io_threads=threads,
        timeout_s=60.0,
    )
    tier = ObjectStoreTier(config, region, identity)
    try:
        store_s = timed(lambda: wait(tier, TransferJob(1, keys, tuple(range(n)))))
        load_s = timed(lambda: wait(tier, TransferJob(2, keys, tuple(range(n, 2 * n))), True))
    finally:
        tier.close()
    assert all(bytes(region.view(i)) == bytes(region.view(n + i)) for i in range(n))
    return store_s, load_s


def wait(tier: ObjectStoreTier, job: TransferJob, load: bool = False) -> None:
    (tier.submit_load if load else tier.submit_store)(job)
    while not (results := tier.get_finished_jobs()):
        time.sleep(0.0005)
    assert results[0].ok, results[0].error


def mbps(size: int, n: int, seconds: float) -> float:
    return round(size * n / seconds / 1e6, 1)


def compare_clients(raw: Raw, size: int, n: int, repeats: int) -> dict[str, dict[str, float]]:
    """Best MB/s and least client CPU (seconds per GB moved, all threads) of each client."""
    data = bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8))
    ops: dict[str, list[tuple[str, Callable[[], float]]]] = {
        "obstore": [("put", lambda: raw.obstore_put(data, n)), ("get", lambda: raw.obstore_get(n))],
        "boto3": [("put", lambda: raw.boto3_put(data, n)), ("get", lambda: raw.boto3_get(n))],
    }
    best: dict[str, dict[str, float]] = {"obstore": {}, "boto3": {}}
    for round_ in range(repeats):
        for client in sorted(ops, reverse=bool(round_ % 2)):  # alternate which client goes first
            for op, fn in ops[client]:
                cpu = time.process_time()
                wall = fn()
                cpu_per_gb = (time.process_time() - cpu) / (size * n / 1e9)
                keep_best(best[client], op, mbps(size, n, wall), cpu_per_gb)
    return best


def keep_best(figures: dict[str, float], op: str, rate: float, cpu_per_gb: float) -> None:
    figures[f"{op}_MBps"] = max(figures.get(f"{op}_MBps", 0.0), rate)
    old = figures.get(f"{op}_cpu_s_per_GB", float("inf"))
    figures[f"{op}_cpu_s_per_GB"] = round(min(old, cpu_per_gb), 2)


def compare_tier(raw: Raw, endpoint: str, size: int, n: int, repeats: int) -> dict[str, Any]:
    data = bytes(np.random.default_rng(1).integers(0, 256, size + HEADER_BYTES, dtype=np.uint8))
    rounds: list[dict[str, float]] = []
    for _ in range(repeats):
        seconds = {"raw_put": raw.obstore_put(data, n), "raw_get": raw.obstore_get(n)}
        seconds["tier_store"], seconds["tier_load"] = tier_rounds(endpoint, size, n, raw.threads)
        rounds.append({name: mbps(size, n, s) for name, s in seconds.items()})
    return {
        "chunks": n,
        "store_MBps": summary(rounds, "raw_put", "tier_store"),
        "load_MBps": summary(rounds, "raw_get", "tier_load"),
    }


def summary(rounds: list[dict[str, float]], raw: str, tier: str) -> dict[str, float]:
    """Best of each side, and the median over rounds of tier / raw in the same round."""
    paired = sorted(r[tier] / r[raw] for r in rounds)
    best_raw, best_tier = max(r[raw] for r in rounds), max(r[tier] for r in rounds)
    return {
        "raw": best_raw,
        "tier": best_tier,
        "ratio_of_best": round(best_tier / best_raw, 2),
        "median_paired_ratio": round(paired[len(paired) // 2], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-mib", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    proc, endpoint = start_server()
    try:
        raw = Raw(endpoint, args.concurrency)
        report: dict[str, Any] = {
            "benchmark": "obj_tier",
            "server": "moto (own process, 127.0.0.1)",
            "python": platform.python_version(),
            "cpus": _cpus(),
            "concurrency": args.concurrency,
            "total_mib": args.total_mib,
            "clients": {},
            "tier": {},
        }
        for size in SIZES:
            n = max(1, (args.total_mib << 20) // size)
            label = f"{size >> 20}MiB"
            report["clients"][label] = compare_clients(raw, size, n, args.repeats)
            report["tier"][label] = compare_tier(raw, endpoint, size, n, args.repeats)
    finally:
        proc.kill()
    print(json.dumps(report, indent=1))


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    main()
