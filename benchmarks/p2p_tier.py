"""p2p tier fetch throughput between two processes on loopback, next to raw pyzmq. Prints JSON.

For chunks of 2 MiB and 8 MiB, with CURVE off and on, a serving process holds ``--total-mib`` of
chunks in its host tier and this process loads all of them:

* raw: a ROUTER process answers one request per batch with the frames the tier sends (a
  4096-byte header and the payload, ``copy=False`` out of ``--total-mib`` of distinct chunk
  buffers, as the tier's host slots are), batches as big as the tier's and as many in flight;
  the DEALER here receives them ``copy=False`` and does nothing else (no verification, no copy
  into a slot). With CURVE, both ends encrypt, as the tier's do;
* raw into slots: the same, each payload received with ``recv_into`` straight into its own host
  slot (what the tier must do with a chunk, less the verification and the protocol);
* tier server: the raw client, speaking the tier's protocol (a handshake, then FETCH
  requests of the same batches) to the tier's ZeroMQ server: what serving costs, without the
  tier's client (``server_ratio``, against raw);
* tier: a ``PeerTier`` loads every chunk from a ``TieringManager`` with ``serve`` (answered by
  the manager's own driver thread, as on an idle prefill node): the full path (lookup answers,
  slot holds, header + xxh3-128 checksum on the server, verification here), over ZeroMQ
  (``tier``: one copy out of libzmq's message into the host slot) and, without CURVE, over
  plain TCP (``tier_tcp``: received straight into the slot); ``--transport`` picks.

Each row runs ``--repeats`` rounds after one untimed warm-up round, the sides back to back in
every round (which goes first rotates), each side loading every chunk ``--loads-per-round``
times in a row (4: a round of one 256 MiB load lasted under 0.1 s, and the ratios of rounds
that short spread by +-0.1 on a shared machine). It reports the median (and for raw and the
tiers the best) round of each side, and ``ratio`` (``ratio_into_slots``; ``tcp_ratio``... for
the tier over TCP), the median over rounds of tier / raw (raw into slots) throughput in that
round, with its 95 % interval (``ratio_interval``...; ``kvtier.bench.verdict``).
Before 2026-12-03 the raw server sent one 2 or 8 MiB buffer for every chunk, always in the CPU
cache, which the tier's 256 MiB of slots never are.
``SIDE_faults_per_gb``: this process's minor page faults (every thread's) per GB a side
received, median over rounds; over ZeroMQ, mostly pages of libzmq's receive buffers faulted in
afresh. They set the tier's throughput more than anything in the tier does: 20k-89k per GB
from one process to the next, 3.1-2.5 GB/s at 2 MiB
(``docs/performance/2026-12-07-peer-malloc.md``; ``benchmarks/malloc_ab.py``) until kvtier set
glibc's malloc thresholds itself at start (``tune_malloc``, ``kvtier.core.malloc_settings``).
Every process here sets them as a ``TieringManager`` does (``--no-tune-malloc``: malloc as glibc
starts); the JSON names the outcome (``tune_malloc``) and the ``GLIBC_TUNABLES`` it ran with.
``--pin`` (off by default) gives the serving processes the first half of the CPUs this process
may use and this process the rest, as two hosts would have them.
Throughput is payload bytes per second (GB = 1e9). ``load`` is the 1-minute load average at
start and end: on a shared machine, compare only ratios, never absolute figures across runs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from _p2p_report import TIER_SIDE, faults_per_gb, summary

from kvtier import CacheIdentity, KVLayout, TieringConfig, TieringManager
from kvtier.core import malloc_settings
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.peer.config import P2PTierConfig
from kvtier.tiers.peer.curve_keys import read_key, write_keypair
from kvtier.tiers.peer.protocol import FETCH, MAX_IN_FLIGHT, fetch_batch, hello, keyed
from kvtier.tiers.peer.tier import PeerTier
from kvtier.tiers.shared.codec import HEADER_BYTES

BLOCKS_PER_CHUNK = {2 << 20: 4, 8 << 20: 16}
Keys = dict[str, str]  # CURVE key file paths by role; empty: CURVE off


def identity_for(chunk_bytes: int) -> CacheIdentity:
    layout = KVLayout(
        num_layers=8,
        num_kv_heads=8,
        head_dim=128,
        dtype="bfloat16",
        block_size=16,
        blocks_per_chunk=BLOCKS_PER_CHUNK[chunk_bytes],
    )
    return CacheIdentity(model="bench/model", layout=layout)


def keys_for(n: int) -> list[ChunkKey]:
    return [ChunkKey(i.to_bytes(32, "little")) for i in range(n)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def make_keys(folder: Path) -> Keys:
    """A server and a client key pair, the client allowed in (``kvtier peer keygen``'s layout)."""
    server_public, server_secret = write_keypair(folder, "server")
    client_public, client_secret = write_keypair(folder, "client")
    (folder / "clients").mkdir()
    shutil.copy(client_public, folder / "clients" / "client.public")
    return {
        "server_secret": str(server_secret),
        "server_public": str(server_public),
        "client_secret": str(client_secret),
        "clients": str(folder / "clients"),
    }


# -- serving processes ------------------------------------------------------------------------
def serve_tier(
    chunk_bytes: int, n: int, port: int, tune: bool, transport: str, keys: Keys, conn: Connection
) -> None:
    pin(conn.recv())
    serve: dict[str, Any] = {"port": port, "transport": transport}
    if keys:
        serve |= {
            "curve_secret_key_file": keys["server_secret"],
            "curve_client_keys_dir": keys["clients"],
        }
    config = TieringConfig.from_dict(
        {"cpu_bytes_to_use": (n + 1) * chunk_bytes, "serve": serve, "tune_malloc": tune}
    )
    with TieringManager(config, identity_for(chunk_bytes)) as manager:
        plan = manager.prepare_store(keys_for(n))
        assert plan is not None
        payload = np.random.default_rng(0).integers(0, 256, chunk_bytes, dtype=np.uint8)
        for slot in plan.slots:
            manager.region.numpy(slot)[:] = payload
        manager.complete_store(plan.keys)
        conn.send("ready")
        conn.recv()  # the manager's driver thread serves meanwhile


def serve_raw(
    chunk_bytes: int, n: int, port: int, tune: bool, keys: Keys, conn: Connection
) -> None:
    pin(conn.recv())
    if tune:
        malloc_settings.apply()
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    if keys:
        router.curve_server = True
        router.curve_secretkey = read_key(keys["server_secret"], "server secret")
    router.bind(f"tcp://127.0.0.1:{port}")
    header, payloads = bytes(HEADER_BYTES), np.ones((n, chunk_bytes), dtype=np.uint8)
    conn.send("ready")
    sent = 0
    while not conn.poll():
        if not router.poll(50):
            continue
        peer, request = router.recv_multipart()
        frames: list[bytes | memoryview] = [b"meta"]
        for i in range(sent, sent + int(request)):
            frames += [header, memoryview(payloads[i % n])]
        sent += int(request)
        router.send_multipart([peer, *frames], copy=False)
    context.destroy(linger=0)


# -- clients ----------------------------------------------------------------------------------
def raw_round(
    dealer: zmq.Socket[bytes],
    chunk_bytes: int,
    n: int,
    slots: HostRegion | None = None,
    protocol: bool = False,
) -> float:
    """Fetch ``n`` chunks; with ``slots``, each payload received into its own slot. With
    ``protocol``, the requests are the tier's FETCH messages (to a tier server)."""
    per_request = fetch_batch(chunk_bytes)
    requests = [min(per_request, n - i) for i in range(0, n, per_request)]
    start, sent, received, landed = time.perf_counter(), 0, 0, 0
    header = bytearray(HEADER_BYTES)
    keys = keys_for(n)
    while received < len(requests):
        while sent < len(requests) and sent - received < MAX_IN_FLIGHT:
            first = sent * per_request
            asked = keys[first : first + requests[sent]]
            ask = keyed(FETCH, sent + 1, asked) if protocol else str(requests[sent]).encode()
            dealer.send(ask)
            sent += 1
        if slots is None:
            frames = dealer.recv_multipart(copy=False)
            assert len(frames) == 1 + 2 * requests[received]
        else:
            dealer.recv(copy=False)
            for _ in range(requests[received]):
                dealer.recv_into(header)
                assert dealer.recv_into(slots.view(landed % n)) == chunk_bytes
                landed += 1
        received += 1
    return time.perf_counter() - start


def tier_round(tier: PeerTier, n: int, job_id: int) -> float:
    start = time.perf_counter()
    tier.submit_load(TransferJob(job_id, tuple(keys_for(n)), tuple(range(n))))
    while not (results := tier.get_finished_jobs()):
        time.sleep(0.002)  # an engine polls once per scheduler step, not in a hot loop
    seconds = time.perf_counter() - start
    assert results[0].ok, results[0].error
    assert len(results[0].succeeded) == n
    return seconds


def raw_dealer(context: zmq.Context[Any], port: int, keys: Keys) -> zmq.Socket[bytes]:
    dealer: zmq.Socket[bytes] = context.socket(zmq.DEALER)
    if keys:
        secret = read_key(keys["client_secret"], "client secret")
        dealer.curve_secretkey, dealer.curve_publickey = secret, zmq.curve_public(secret)
        dealer.curve_serverkey = read_key(keys["server_public"], "server public")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    return dealer


def bare_client(
    context: zmq.Context[Any], chunk_bytes: int, port: int, keys: Keys
) -> zmq.Socket[bytes]:
    """A DEALER that has shaken hands with the tier server on ``port``, to fetch from it as raw
    pyzmq does from the raw server: the serving side alone, without the tier's client."""
    dealer = raw_dealer(context, port, keys)
    dealer.send(hello(1, identity_for(chunk_bytes).digest))
    assert dealer.poll(10_000), "the tier server did not answer the handshake"
    dealer.recv_multipart()
    return dealer


def peer_tier(chunk_bytes: int, n: int, port: int, keys: Keys, transport: str) -> PeerTier:
    config = P2PTierConfig(
        transport=transport,  # type: ignore[arg-type]
        host="127.0.0.1",
        port=port,
        timeout_s=10.0,
        curve_secret_key_file=keys.get("client_secret"),
        curve_server_key_file=keys.get("server_public"),
    )
    return PeerTier(config, HostRegion(n, chunk_bytes, pin=False), identity_for(chunk_bytes))


def halves(pinned: bool) -> tuple[set[int], set[int]] | None:
    """The CPUs of the serving processes and of this one with ``--pin``; None without, or where
    this process may use a single CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pinned or len(cpus) < 2:
        return None
    return set(cpus[: len(cpus) // 2]), set(cpus[len(cpus) // 2 :])


def pin(cpus: set[int] | None) -> None:
    """Keep this process, and every thread it starts from now on, on ``cpus`` (None: any)."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


def start_servers(
    chunk_bytes: int,
    n: int,
    keys: Keys,
    transports: list[str],
    cpus: set[int] | None = None,
    tune: bool = True,
) -> list[Any]:
    """The raw server, then a tier server per transport, each on ``cpus`` and with kvtier's
    malloc settings if ``tune``: (process, pipe, port) each."""
    ctx = mp.get_context("spawn")
    servers = []
    targets: list[tuple[Any, tuple[Any, ...]]] = [(serve_raw, ())]
    targets += [(serve_tier, (transport,)) for transport in transports]
    for target, args in targets:
        here, there = ctx.Pipe()
        port = free_port()
        proc = ctx.Process(target=target, args=(chunk_bytes, n, port, tune, *args, keys, there))
        proc.start()
        here.send(cpus)
        assert here.recv() == "ready"
        servers.append((proc, here, port))
    return servers


def measure(
    chunk_bytes: int, args: argparse.Namespace, keys: Keys, transports: list[str]
) -> dict[str, Any]:
    """One row: raw, raw into slots and the tier over each of ``transports``, side by side."""
    n, loads = max(1, (args.total_mib << 20) // chunk_bytes), args.loads_per_round
    serving_cpus = None if args.cpus is None else args.cpus[0]
    servers = start_servers(chunk_bytes, n, keys, transports, serving_cpus, args.tune_malloc)
    tiers = [
        peer_tier(chunk_bytes, n, port, keys, t)
        for (_, _, port), t in zip(servers[1:], transports, strict=True)
    ]
    context = zmq.Context()
    dealer = raw_dealer(context, servers[0][2], keys)
    slots = HostRegion(n, chunk_bytes, pin=False)
    sides: dict[str, Callable[[int], float]] = {
        "raw": lambda round_: raw_round(dealer, chunk_bytes, n),
        "raw_into_slots": lambda round_: raw_round(dealer, chunk_bytes, n, slots),
    }
    for transport, tier in zip(transports, tiers, strict=True):
        sides[TIER_SIDE[transport]] = partial(tier_round, tier, n)
    if "zmq" in transports:
        bare = bare_client(context, chunk_bytes, servers[1 + transports.index("zmq")][2], keys)
        sides["tier_server"] = lambda round_: raw_round(bare, chunk_bytes, n, protocol=True)
    names = list(sides)
    rounds: list[dict[str, float]] = []
    faults: list[dict[str, float]] = []
    try:
        for round_ in range(args.repeats + 1):  # who goes first rotates, so none gains by it
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            ids = range(round_ * loads, (round_ + 1) * loads)  # a job id per load
            rounds.append({})
            faults.append({})
            for name in order:
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                rounds[-1][name] = sum(sides[name](i) for i in ids)
                faults[-1][name] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    finally:
        for tier in tiers:
            tier.close()
        context.destroy(linger=0)
        for proc, here, _ in servers:
            here.send("stop")
            proc.join()
    row = {"chunk_mib": chunk_bytes >> 20, "curve": bool(keys), "chunks": n}
    payload = loads * n * chunk_bytes
    return row | summary(payload, rounds[1:]) | faults_per_gb(payload, faults[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument(
        "--loads-per-round",
        type=int,
        default=4,
        help="loads of every chunk per side and round, back to back (1 before 2026-12-06)",
    )
    parser.add_argument("--curve", choices=("off", "on", "both"), default="both")
    parser.add_argument("--transport", choices=("zmq", "tcp", "both"), default="both")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="serving processes on half the CPUs, this one on the other half, as on two hosts",
    )
    parser.add_argument(
        "--tune-malloc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="kvtier's malloc thresholds in every process, as a TieringManager sets them "
        "(kvtier.core.malloc_settings); --no-tune-malloc: malloc as glibc starts",
    )
    args = parser.parse_args()
    malloc = malloc_settings.apply() if args.tune_malloc else "off"
    args.cpus = halves(args.pin)
    if args.cpus is not None:
        pin(args.cpus[1])  # before any context or tier starts a thread (numpy's OpenBLAS
        # thread, started at import, stays unpinned: it sleeps throughout)
    if args.repeats < 1 or args.loads_per_round < 1:
        parser.error("--repeats and --loads-per-round: 1 or more")
    transports = ["zmq", "tcp"] if args.transport == "both" else [args.transport]
    load_start, rows = os.getloadavg()[0], []
    with tempfile.TemporaryDirectory() as folder:
        keys = make_keys(Path(folder))
        for curve in {"off": [False], "on": [True], "both": [False, True]}[args.curve]:
            usable = [t for t in transports if not curve or t == "zmq"]  # TCP: no CURVE
            for size in sorted(BLOCKS_PER_CHUNK) if usable else []:
                row = measure(size, args, keys if curve else {}, usable)
                rows.append(row)
    load = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    print(
        json.dumps(
            {
                "benchmark": "p2p_tier",
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "zmq": zmq.zmq_version(),
                "load": load,
                "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
                "tune_malloc": malloc,
                "pinned": None if args.cpus is None else [sorted(c) for c in args.cpus],
                "rows": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
