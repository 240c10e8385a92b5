"""A separate OS process driving a FilesystemTier, for the multi-process tests.

Run as ``python -m tests.tiers.fs.fs_worker <command> ...`` from the repository root. Commands:

* ``share``: wait for a start file, store its own keys and a shared key set, then load the other
  process's keys and the shared ones; prints one JSON line with the outcome;
* ``store-forever``: store chunks until killed, printing each finished job's keys (hex);
* ``fsize``: store some chunks, then set a file-size limit (SIGXFSZ ignored, so writes fail with
  EFBIG), try more stores, load the first ones back; prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
from itertools import count

import tests.child_process  # noqa: F401  (first: the kvtier of this checkout)

# isort: split
from kvtier import CacheIdentity, ChunkKey, KVLayout
from kvtier.config import FsTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs.tier import FilesystemTier
from tests.conftest import chunk_pattern, collect, fill, make_keys, settle_lookup, wait_for


def layout(blocks_per_chunk: int) -> KVLayout:
    return KVLayout(
        num_layers=2,
        num_kv_heads=2,
        head_dim=16,
        dtype="float32",
        block_size=4,
        blocks_per_chunk=blocks_per_chunk,
    )


def identity_for(blocks_per_chunk: int) -> CacheIdentity:
    return CacheIdentity(model="test/model", revision="r1", layout=layout(blocks_per_chunk))


def open_tier(root: str, blocks_per_chunk: int, slots: int) -> tuple[FilesystemTier, HostRegion]:
    identity = identity_for(blocks_per_chunk)
    region = HostRegion(slots, identity.layout.chunk_bytes)
    config = FsTierConfig(root_dir=root, min_free_bytes=0, negative_ttl_s=0.01)
    return FilesystemTier(config, region, identity), region


def store_all(
    tier: FilesystemTier, region: HostRegion, keys: list[ChunkKey], first_id: int
) -> bool:
    """Store ``keys`` in jobs of 4 (all submitted at once); whether every job succeeded."""
    ids = []
    for start in range(0, len(keys), 4):
        part = keys[start : start + 4]
        slots = tuple(range(start, start + len(part)))
        for key, slot in zip(part, slots, strict=True):
            fill(region, slot, key)
        ids.append(first_id + start)
        tier.submit_store(TransferJob(ids[-1], tuple(part), slots))
    return all(result.ok for result in collect(tier, ids, timeout=60).values())


def load_and_check(
    tier: FilesystemTier, region: HostRegion, keys: list[ChunkKey]
) -> dict[str, int]:
    """Settle lookups, load every key, and count byte-identical and wrong chunks."""
    for key in keys:
        settle_lookup(tier, key, timeout=60)
    slots = tuple(range(len(keys)))
    tier.submit_load(TransferJob(10**6, tuple(keys), slots))
    result = collect(tier, [10**6], timeout=60)[10**6]
    good = [k for k, s in zip(keys, slots, strict=True) if _holds(region, s, k)]
    wrong = [k for k in result.succeeded if k not in good]
    return {"loaded": len(result.succeeded), "identical": len(good), "wrong": len(wrong)}


def _holds(region: HostRegion, slot: int, key: ChunkKey) -> bool:
    return bytes(region.view(slot)) == chunk_pattern(key, region.slot_bytes)


def wait_file(path: str, timeout: float = 120.0) -> None:
    wait_for(lambda: os.path.exists(path), timeout, f"fs_worker: {path} to appear")


def share(args: argparse.Namespace) -> dict[str, object]:
    identity = identity_for(2)
    own, other = make_keys(identity, args.n, args.seed), make_keys(identity, args.n, args.other)
    shared = make_keys(identity, args.n, seed=12345)
    tier, region = open_tier(args.root, 2, 2 * args.n)
    wait_file(args.go)
    stored_ok = store_all(tier, region, own + shared, first_id=0)
    open(args.done, "w").close()
    wait_file(args.other_done)
    outcome = load_and_check(tier, region, other + shared)
    tier.close()
    return {"stored_ok": stored_ok, **outcome, "stats": tier.stats()}


def store_forever(args: argparse.Namespace) -> None:
    tier, region = open_tier(args.root, args.blocks_per_chunk, 64)
    identity = identity_for(args.blocks_per_chunk)
    for batch in count():
        keys = make_keys(identity, 16, seed=batch)
        for job, start in enumerate(range(0, 16, 4)):
            slots = tuple(range(start, start + 4))
            for key, slot in zip(keys[start : start + 4], slots, strict=True):
                fill(region, slot, key)
            tier.submit_store(TransferJob(batch * 4 + job, tuple(keys[start : start + 4]), slots))
        for result in collect(tier, range(batch * 4, batch * 4 + 4), timeout=60).values():
            if result.ok:
                print(" ".join(k.hex() for k in result.succeeded), flush=True)


def file_size_limit(args: argparse.Namespace) -> dict[str, object]:
    identity = identity_for(2)
    tier, region = open_tier(args.root, 2, 16)
    before, after = make_keys(identity, 4, seed=1), make_keys(identity, 4, seed=2)
    stored_before = store_all(tier, region, before, first_id=0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = region.slot_bytes  # smaller than a chunk file (header + payload)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    stored_after = store_all(tier, region, after, first_id=100)
    outcome = load_and_check(tier, region, before)
    tier.close()
    return {
        "stored_before": stored_before,
        "stored_after": stored_after,
        **outcome,
        "stats": tier.stats(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["share", "store-forever", "fsize"])
    parser.add_argument("--root", required=True)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--other", type=int, default=0)
    parser.add_argument("--go", default="")
    parser.add_argument("--done", default="")
    parser.add_argument("--other-done", default="")
    parser.add_argument("--blocks-per-chunk", type=int, default=2)
    args = parser.parse_args()
    if args.command == "store-forever":
        store_forever(args)
        return
    outcome = share(args) if args.command == "share" else file_size_limit(args)
    print(json.dumps(outcome), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
