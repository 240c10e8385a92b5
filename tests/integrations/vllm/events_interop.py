"""Decode kvtier's KV event batches with vLLM's own structs (run in the vLLM test venv).

Prints one JSON object: what vLLM's ``KVEventBatch`` decoder made of a kvtier batch.
"""

from __future__ import annotations

import json

import msgspec
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

from kvtier.keys import ChunkKey
from kvtier.telemetry.kv_events import EventKind, KVEvent, encode_batch

KEYS = [ChunkKey(bytes([i]) * 32) for i in range(3)]
EVENTS = [
    KVEvent(0, EventKind.STORED, KEYS[0], "accelerator", "host"),
    KVEvent(1, EventKind.WRITTEN, KEYS[0], "host", "fs"),
    KVEvent(2, EventKind.PROMOTED, KEYS[1], "obj", "host", "remote"),
    KVEvent(3, EventKind.EVICTED, KEYS[0], "host", None),
    KVEvent(4, EventKind.REMOVED, KEYS[2], "fs", None),
]


def describe(event: BlockStored | BlockRemoved) -> dict[str, object]:
    return {
        "type": type(event).__name__,
        "hashes": [h.hex() if isinstance(h, bytes) else h for h in event.block_hashes],
        "medium": event.medium,
        "locality": event.locality,
        "ownership": event.ownership,
        "block_size": getattr(event, "block_size", None),
    }


def main() -> None:
    batch = msgspec.msgpack.decode(encode_batch(EVENTS, 256, 1.25), type=KVEventBatch)
    print(json.dumps({"ts": batch.ts, "events": [describe(e) for e in batch.events]}))


if __name__ == "__main__":
    main()
