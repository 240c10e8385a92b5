"""The bounded obj tier's start-up index rebuild: time and memory. Prints JSON.

* ``listing``: ``--objects`` chunk objects (128-byte payloads behind the 4 KiB header, planted
  with obstore's async puts) in a moto S3 server of their own process; a bounded
  ``ObjectStoreTier`` starts on that prefix and rebuilds its index from the paged listing
  (``kvtier.tiers.s3.listing``). Reported: seconds from the tier's start to ``wait_rebuilt``,
  objects per second, pages, and this process's peak RSS growth over the rebuild (``ru_maxrss``,
  which counts the client's Rust allocations too; the process has done nothing else large).
* ``merge``: no server: ``--synthetic`` chunks fed to ``NamespaceListing`` as pages of 1,000
  (as S3 returns them) and merged into an ``ObjectBound`` with no byte bound, without and with
  ``max_age_s`` (which keeps each object's last use too), to measure what a listing of that size
  costs in Python: seconds (untraced), then tracemalloc's peak and what is left (the index) per
  object, in a second run under tracemalloc.

``python benchmarks/obj_rebuild.py --objects 20000 --synthetic 1000000``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import threading
import time
import tracemalloc
from typing import Any
from unittest import mock

import obstore
from obj_tier import start_server  # beside this script
from obstore.store import S3Store

from kvtier import CacheIdentity, KVLayout
from kvtier.config import ObjTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.s3.bound import ObjectBound
from kvtier.tiers.s3.listing import NamespaceListing
from kvtier.tiers.s3.tier import ObjectStoreTier
from kvtier.tiers.shared import codec

TINY = KVLayout(
    num_layers=1, num_kv_heads=1, head_dim=8, dtype="float16", block_size=4, blocks_per_chunk=1
)
KEYS = ("kvtier-bench", "kvtier-bench-secret")


def plant(store: S3Store, namespace: str, n: int) -> float:
    body = bytes(codec.HEADER_BYTES + TINY.chunk_bytes)

    async def put_all() -> None:
        gate = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            async with gate:
                await obstore.put_async(store, f"{namespace}/{i:064x}", body)

        await asyncio.gather(*(one(i) for i in range(n)))

    start = time.perf_counter()
    asyncio.run(put_all())
    return time.perf_counter() - start


def rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def listing_run(n: int) -> dict[str, Any]:
    proc, endpoint = start_server()
    try:
        store = S3Store(
            "bench", endpoint=endpoint, region="us-east-1", access_key_id=KEYS[0],
            secret_access_key=KEYS[1], client_options={"allow_http": True},
        )  # fmt: skip
        identity = CacheIdentity(model="bench/model", revision="r", layout=TINY)
        planted_s = plant(store, f"bench/{identity.hexdigest}", n)
        config = ObjTierConfig(
            bucket="bench", endpoint_override=endpoint, access_key=KEYS[0], secret_key=KEYS[1],
            prefix="bench", max_bytes=1 << 60,
        )  # fmt: skip
        region = HostRegion(4, TINY.chunk_bytes)
        before = rss_kib()
        start = time.perf_counter()
        tier = ObjectStoreTier(config, region, identity)
        assert tier.wait_rebuilt(3600)
        seconds = time.perf_counter() - start
        stats = tier.stats()
        tier.close()
    finally:
        proc.kill()
        proc.wait()
    return {
        "objects": n,
        "plant_s": round(planted_s, 2),
        "rebuild_s": round(seconds, 3),
        "objects_per_s": round(n / seconds),
        "pages": stats["listing_pages"],
        "indexed": stats["index_chunks"],
        "peak_rss_growth_mib": round((rss_kib() - before) / 1024, 1),
    }


def synthetic_pages(n: int, namespace: str) -> Any:
    for start in range(0, n, 1000):
        yield [
            (f"{namespace}/{i:064x}", 4224, 1.7e9 + i) for i in range(start, min(n, start + 1000))
        ]


def merge_run(n: int, max_age_s: float | None, traced: bool) -> dict[str, Any]:
    """List ``n`` synthetic chunks and merge them; with ``traced``, under tracemalloc (slower:
    its memory figures only), else timed."""
    client = mock.Mock()
    client.list_pages = lambda prefix, after, size: synthetic_pages(n, prefix)
    bound = ObjectBound(None, max_age_s, delete=lambda key: None, submit=lambda fn: None)
    if traced:
        tracemalloc.start()
    start = time.perf_counter()
    listing = NamespaceListing(client, "p/d")
    assert listing.run(threading.Event())
    listed_s, listed_bytes = time.perf_counter() - start, tracemalloc.get_traced_memory()[0]
    assert listing.merge_into(bound, threading.Event(), bound.index.mark())
    seconds = time.perf_counter() - start
    left, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(bound.index) == n
    if not traced:
        return {"objects": n, "list_s": round(listed_s, 2), "list_and_merge_s": round(seconds, 2)}
    return {
        "listed_bytes_per_object": round(listed_bytes / n, 1),
        "peak_bytes_per_object": round(peak / n, 1),
        "index_bytes_per_object": round(left / n, 1),
    }


def merged(n: int, max_age_s: float | None) -> dict[str, Any]:
    return merge_run(n, max_age_s, False) | merge_run(n, max_age_s, True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=20_000)
    parser.add_argument("--synthetic", type=int, default=1_000_000)
    args = parser.parse_args()
    out: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    if args.objects:  # first: the peak RSS growth is this process's
        out["listing"] = listing_run(args.objects)
    if args.synthetic:
        out["merge"] = merged(args.synthetic, None)
        out["merge_with_max_age"] = merged(args.synthetic, 86_400.0)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
