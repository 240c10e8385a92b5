"""p2p tier fetch throughput between two processes on loopback, next to raw pyzmq. Prints JSON.

For chunks of 2 MiB and 8 MiB, a serving process holds ``--total-mib`` of chunks in its host tier
and this process loads all of them:

* raw: a ROUTER process answers one request per batch with the same frames the tier sends (a
  4096-byte header and the payload, ``copy=False`` out of one preallocated buffer), batches as
  big as the tier's and as many in flight; the DEALER here receives them ``copy=False`` and does
  nothing else (no verification, no copy into a slot);
* tier: a ``PeerTier`` loads every chunk from a ``TieringManager`` with ``serve``: the full path
  (lookup answers, slot holds, header + xxh3-128 checksum on the server, verification and one
  copy into the host slot here).

Each figure is the best of ``--repeats`` rounds, the two sides interleaved, after one untimed
warm-up round; throughput is payload bytes per second (GB = 1e9).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import socket
import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import zmq

from kvtier import CacheIdentity, KVLayout, TieringConfig, TieringManager
from kvtier.config import P2PTierConfig
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.peer.link import MAX_IN_FLIGHT
from kvtier.tiers.peer.tier import FETCH_BATCH_BYTES, PeerTier
from kvtier.tiers.shared.codec import HEADER_BYTES

BLOCKS_PER_CHUNK = {2 << 20: 4, 8 << 20: 16}


def identity_for(chunk_bytes: int) -> CacheIdentity:
    layout = KVLayout(num_layers=8, num_kv_heads=8, head_dim=128, dtype="bfloat16",
                      block_size=16, blocks_per_chunk=BLOCKS_PER_CHUNK[chunk_bytes])  # fmt: skip
    return CacheIdentity(model="bench/model", layout=layout)


def keys_for(n: int) -> list[ChunkKey]:
    return [ChunkKey(i.to_bytes(32, "little")) for i in range(n)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- serving processes ------------------------------------------------------------------------
def serve_tier(chunk_bytes: int, n: int, port: int, conn: Connection) -> None:
    identity = identity_for(chunk_bytes)
    config = TieringConfig.from_dict({"cpu_bytes_to_use": (n + 1) * chunk_bytes,
                                      "serve": {"port": port}})  # fmt: skip
    with TieringManager(config, identity) as manager:
        plan = manager.prepare_store(keys_for(n))
        assert plan is not None
        payload = np.random.default_rng(0).integers(0, 256, chunk_bytes, dtype=np.uint8)
        for slot in plan.slots:
            manager.region.numpy(slot)[:] = payload
        manager.complete_store(plan.keys)
        conn.send("ready")
        server = manager.peer_server
        assert server is not None
        while not conn.poll():
            server.wait_for_work(0.05)
            manager.poll()


def serve_raw(chunk_bytes: int, port: int, conn: Connection) -> None:
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{port}")
    header, payload = bytes(HEADER_BYTES), np.ones(chunk_bytes, dtype=np.uint8)
    conn.send("ready")
    while not conn.poll():
        if not router.poll(50):
            continue
        peer, request = router.recv_multipart()
        count = int(request)
        frames = [b"meta"] + [header, memoryview(payload)] * count
        router.send_multipart([peer, *frames], copy=False)
    context.destroy(linger=0)


# -- clients ----------------------------------------------------------------------------------
def raw_round(dealer: zmq.Socket[bytes], chunk_bytes: int, n: int) -> float:
    per_request = max(1, FETCH_BATCH_BYTES // chunk_bytes)
    requests = [min(per_request, n - i) for i in range(0, n, per_request)]
    start, sent, received = time.perf_counter(), 0, 0
    while received < len(requests):
        while sent < len(requests) and sent - received < MAX_IN_FLIGHT:
            dealer.send(str(requests[sent]).encode())
            sent += 1
        frames = dealer.recv_multipart(copy=False)
        assert len(frames) == 1 + 2 * requests[received]
        received += 1
    return time.perf_counter() - start


def tier_round(tier: PeerTier, n: int, job_id: int) -> float:
    start = time.perf_counter()
    tier.submit_load(TransferJob(job_id, tuple(keys_for(n)), tuple(range(n))))
    while not (results := tier.get_finished_jobs()):
        time.sleep(0.002)  # an engine polls once per scheduler step, not in a hot loop
    seconds = time.perf_counter() - start
    assert results[0].ok, results[0].error
    return seconds


def measure(chunk_bytes: int, total_mib: int, repeats: int) -> dict[str, Any]:
    n = max(1, (total_mib << 20) // chunk_bytes)
    ctx = mp.get_context("spawn")
    tier_port, raw_port = free_port(), free_port()
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [
        ctx.Process(target=serve_tier, args=(chunk_bytes, n, tier_port, pipes[0][1])),
        ctx.Process(target=serve_raw, args=(chunk_bytes, raw_port, pipes[1][1])),
    ]
    for proc, (here, _) in zip(procs, pipes, strict=True):
        proc.start()
        assert here.recv() == "ready"
    region = HostRegion(n, chunk_bytes, pin=False)
    tier = PeerTier(P2PTierConfig(host="127.0.0.1", port=tier_port, timeout_s=10.0),
                    region, identity_for(chunk_bytes))  # fmt: skip
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{raw_port}")
    raw_s, tier_s = [], []
    try:
        for round_ in range(repeats + 1):
            raw_s.append(raw_round(dealer, chunk_bytes, n))
            tier_s.append(tier_round(tier, n, round_))
    finally:
        tier.close()
        context.destroy(linger=0)
        for proc, (here, _) in zip(procs, pipes, strict=True):
            here.send("stop")
            proc.join()
    payload = n * chunk_bytes
    raw_gbps, tier_gbps = payload / min(raw_s[1:]) / 1e9, payload / min(tier_s[1:]) / 1e9
    return {"chunk_mib": chunk_bytes >> 20, "chunks": n, "raw_gbps": round(raw_gbps, 3),
            "tier_gbps": round(tier_gbps, 3), "ratio": round(tier_gbps / raw_gbps, 3)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = [measure(size, args.total_mib, args.repeats) for size in sorted(BLOCKS_PER_CHUNK)]
    print(json.dumps({"benchmark": "p2p_tier", "machine": platform.machine(),
                      "zmq": zmq.zmq_version(), "rows": rows}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
