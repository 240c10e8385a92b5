"""Manager micro-benchmark: lookup and store bookkeeping cost per chunk.

A 512-chunk prefix is stored in host memory; then ``lookup`` of the whole prefix (all host hits),
``prepare_store`` + ``complete_store`` of fresh chunks (with evictions), and ``prepare_load`` +
``complete_load`` are timed. Bookkeeping only: no secondary tier, no bytes copied.

Then a cold prefix: ``lookup`` of 1024 chunks that no tier holds, with an fs tier attached (each
repetition a prefix never seen before, so every answer has to be probed). Prints JSON.
"""

from __future__ import annotations

import json
import platform
import tempfile
import time
from collections.abc import Callable

import numpy as np

from kvtier import CacheIdentity, KVLayout, TieringConfig, TieringManager, chunk_keys

NUM_CHUNKS = 512
COLD_CHUNKS = 1024


def per_chunk_ns(fn: Callable[[], object], chunks: int, repeat: int = 200) -> float:
    """Best-of-``repeat`` nanoseconds per chunk (the least disturbed run on a shared machine)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter_ns()
        fn()
        best = min(best, time.perf_counter_ns() - start)
    return best / chunks


def cold_lookup_ns(identity: CacheIdentity, cpu_bytes: int) -> float:
    """Per chunk: ``lookup`` of a 1024-chunk prefix held nowhere, an fs tier attached."""
    tokens = np.arange(COLD_CHUNKS * identity.layout.tokens_per_chunk)
    fresh = iter(range(1, 1_000_000))
    with tempfile.TemporaryDirectory() as root:
        tiers = [{"type": "fs", "root_dir": root}]
        config = TieringConfig.from_dict({"cpu_bytes_to_use": cpu_bytes, "secondary_tiers": tiers})
        with TieringManager(config, identity) as manager:
            return per_chunk_ns(
                lambda: manager.lookup(chunk_keys(tokens, identity, salt=str(next(fresh)))),
                COLD_CHUNKS,
                repeat=20,
            ) - per_chunk_ns(lambda: chunk_keys(tokens, identity), COLD_CHUNKS, repeat=20)


def main() -> None:
    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=64, dtype="float16",
                      block_size=16, blocks_per_chunk=1)  # fmt: skip
    identity = CacheIdentity(model="bench/model", layout=layout)
    stride = -(-layout.chunk_bytes // 4096) * 4096
    config = TieringConfig.from_dict({"cpu_bytes_to_use": 4 * NUM_CHUNKS * stride})
    cold_ns = cold_lookup_ns(identity, 4 * NUM_CHUNKS * stride)
    tokens = np.arange(NUM_CHUNKS * layout.tokens_per_chunk)
    keys = chunk_keys(tokens, identity)
    with TieringManager(config, identity) as manager:
        plan = manager.prepare_store(keys)
        assert plan is not None
        manager.complete_store(plan.keys)
        assert manager.lookup(keys) == NUM_CHUNKS
        lookup_ns = per_chunk_ns(lambda: manager.lookup(keys), NUM_CHUNKS)

        def load() -> None:
            manager.prepare_load(keys)
            manager.complete_load(keys)

        load_ns = per_chunk_ns(load, NUM_CHUNKS)
        fresh = iter(range(1, 10_000))

        def store() -> None:
            new = chunk_keys(tokens + next(fresh) * 100_000, identity)
            plan = manager.prepare_store(new)
            assert plan is not None
            manager.complete_store(plan.keys)

        store_ns = per_chunk_ns(store, NUM_CHUNKS, repeat=50)
        hash_ns = per_chunk_ns(lambda: chunk_keys(tokens, identity), NUM_CHUNKS, repeat=50)
    print(json.dumps({
        "benchmark": "manager_ops",
        "prefix_chunks": NUM_CHUNKS,
        "lookup_ns_per_chunk": round(lookup_ns, 1),
        "prepare_complete_load_ns_per_chunk": round(load_ns, 1),
        "store_ns_per_chunk_incl_hashing_and_eviction": round(store_ns, 1),
        "chunk_keys_ns_per_chunk": round(hash_ns, 1),
        "cold_prefix_chunks": COLD_CHUNKS,
        "cold_lookup_with_fs_tier_ns_per_chunk": round(cold_ns, 1),
        "python": platform.python_version(),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
