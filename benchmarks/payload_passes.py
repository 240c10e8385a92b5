"""What one pass over a payload costs: the checksum out of memory and out of cache, and the four
ways a ZeroMQ payload can land in a host slot. Prints JSON.

* ``checksum``: the compiled XXH3-128 (``_checksum.digest``) of ``--chunk-mib`` chunks taken in
  turn from a 1 GiB buffer (each out of memory, as after an O_DIRECT read, which leaves the
  bytes in no cache) and of one chunk again and again (in cache), next to a plain read of the
  same memory (numpy's sum of 64-bit words): how close the hash runs to the memory's speed.
  ``--baseline-pkg NAME`` adds the same figures for another build importable as NAME (e.g. the
  previous commit's ``src/kvtier`` with its imports renamed and its extensions built).
* ``zmq``: a PUSH process streams ``--chunk-mib`` frames (``copy=False``, out of 256 MiB of
  distinct buffers) over TCP on 127.0.0.1; here a PULL socket takes each one as
  ``raw`` (``copy=False``, nothing else), ``into`` (``recv_into`` a host slot), ``into_hash``
  (``recv_into``, then the slot hashed: the peer tier before 2026-12-06) or ``copy_in``
  (``copy=False``, then ``Filling.copy_in``: copied and hashed in one pass, the peer tier since).
  Each ratio is the median over ``--rounds`` rounds of that side over ``raw`` in the same round,
  with its 95 % interval (``kvtier.bench.verdict``); the sides rotate who goes first.
  ``copy_in_over_into_hash``: the same for ``copy_in`` over ``into_hash``.
* ``tier``: a ``PeerTier`` over ZeroMQ loading 256 MiB from a serving process
  (``p2p_tier.py``'s), rounds of 4 loads alternating between the tier as it is (``copy_in``)
  and the tier with ``copy_in`` taken out of every landing (``into_hash``: its path before
  2026-12-06); ``copy_in_over_into_hash`` as above.

GB = 1e9 bytes. On a shared machine compare ratios within a run, never figures across runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np
import zmq

from kvtier.bench import verdict
from kvtier.tiers.shared import _checksum, codec

POOL_BYTES = 256 << 20


def _rate(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 2)


def checksum_speed(module: Any, chunk: int, repeats: int) -> dict[str, float]:
    """GB/s of ``module.digest`` out of memory and in cache, and of a plain read of memory."""
    count = (1 << 30) // chunk
    big = np.random.default_rng(0).integers(0, 256, chunk * count, dtype=np.uint8)
    view = big.data
    parts = [view[i * chunk : (i + 1) * chunk] for i in range(count)]
    words = [big[i * chunk : (i + 1) * chunk].view(np.uint64) for i in range(count)]
    best = {"memory": 0.0, "cache": 0.0, "plain_read_memory": 0.0}
    for _ in range(repeats):
        runs: tuple[tuple[str, Callable[[], object]], ...] = (
            ("memory", lambda: [module.digest(p) for p in parts]),
            ("cache", lambda: [module.digest(parts[0]) for _ in parts]),
            ("plain_read_memory", lambda: [np.add.reduce(w) for w in words]),
        )
        for name, run in runs:
            start = time.perf_counter()
            run()
            best[name] = max(best[name], _rate(chunk * count, time.perf_counter() - start))
    return best


def _push(port: int, chunk: int) -> None:
    socket = zmq.Context().socket(zmq.PUSH)
    socket.setsockopt(zmq.SNDHWM, 16)
    socket.bind(f"tcp://127.0.0.1:{port}")
    pool = np.ones((POOL_BYTES // chunk, chunk), dtype=np.uint8)
    while True:
        for row in pool:
            socket.send(row.data, copy=False)


def _landings(pull: zmq.Socket[bytes], slots: list[memoryview]) -> dict[str, Callable[[int], Any]]:
    def into_hash(i: int) -> None:
        slot = slots[i % len(slots)]
        filling = codec.filling(slot)
        filling.feed(pull.recv_into(slot))
        filling.digest(len(slot))

    def copy_in(i: int) -> None:
        slot = slots[i % len(slots)]
        filling = codec.filling(slot)
        filling.copy_in(pull.recv(copy=False).buffer)
        filling.digest(len(slot))

    return {
        "raw": lambda i: pull.recv(copy=False),
        "into": lambda i: pull.recv_into(slots[i % len(slots)]),
        "into_hash": into_hash,
        "copy_in": copy_in,
    }


def zmq_landing(chunk: int, rounds: int) -> dict[str, Any]:
    """Each way of landing a streamed frame, ``rounds`` rounds of 256 MiB; see the docstring."""
    with_port = zmq.Context().socket(zmq.PULL)
    port = with_port.bind_to_random_port("tcp://127.0.0.1")
    with_port.close(linger=0)
    pusher = mp.get_context("spawn").Process(target=_push, args=(port, chunk), daemon=True)
    pusher.start()
    pull = zmq.Context().socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 16)
    pull.connect(f"tcp://127.0.0.1:{port}")
    slots = np.zeros((POOL_BYTES // chunk, chunk), dtype=np.uint8)
    sides = _landings(pull, [row.data for row in slots])
    count, names = len(slots), list(sides)
    for i in range(2 * count):  # warm-up: every slot and buffer touched once
        sides["raw"](i)
    gbps: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names[round_ % 4 :] + names[: round_ % 4]:
            start = time.perf_counter()
            for i in range(count):
                sides[name](i)
            gbps[name].append(_rate(POOL_BYTES, time.perf_counter() - start))
    pusher.kill()
    pull.close(linger=0)
    return {
        "GBps": {name: statistics.median(v) for name, v in gbps.items()},
        "over_raw": {name: _paired(v, gbps["raw"]) for name, v in gbps.items() if name != "raw"},
        "copy_in_over_into_hash": _paired(gbps["copy_in"], gbps["into_hash"]),
    }


def _paired(sides: list[float], bases: list[float]) -> dict[str, Any]:
    return asdict(verdict.interval([a / b for a, b in zip(sides, bases, strict=True)]))


def tier_landing(chunk: int, rounds: int) -> dict[str, Any]:
    """The peer tier with and without ``copy_in``, alternating; see the module docstring."""
    import p2p_tier  # beside this script

    from kvtier.tiers.peer import link
    from kvtier.tiers.peer.transport import Landing

    fused = {"on": True}

    def landing(buffer: memoryview, feed: Any = None, copy_in: Any = None) -> Landing:
        return Landing(buffer, feed, copy_in if fused["on"] else None)

    vars(link)["Landing"] = landing  # the link builds every landing through this name
    count = POOL_BYTES // chunk
    servers = p2p_tier.start_servers(chunk, count, {}, ["zmq"])
    tier = p2p_tier.peer_tier(chunk, count, servers[1][2], {}, "zmq")
    gbps: dict[str, list[float]] = {"copy_in": [], "into_hash": []}
    try:
        p2p_tier.tier_round(tier, count, 0)
        jobs = iter(range(1, 1 << 30))
        for round_ in range(rounds):
            for name in ("copy_in", "into_hash")[:: 1 if round_ % 2 else -1]:
                fused["on"] = name == "copy_in"
                seconds = sum(p2p_tier.tier_round(tier, count, next(jobs)) for _ in range(4))
                gbps[name].append(_rate(4 * POOL_BYTES, seconds))
    finally:
        vars(link)["Landing"] = Landing
        tier.close()
        for proc, pipe, _ in servers:
            pipe.send("stop")
            proc.join()
    return {
        "GBps": {name: statistics.median(v) for name, v in gbps.items()},
        "copy_in_over_into_hash": _paired(gbps["copy_in"], gbps["into_hash"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-mib", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--baseline-pkg", default=None)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds: 1 or more")
    builds = {"kvtier": _checksum}
    if args.baseline_pkg:
        builds[args.baseline_pkg] = importlib.import_module(
            f"{args.baseline_pkg}.tiers.shared._checksum"
        )
    rows = []
    for mib in args.chunk_mib:
        chunk = mib << 20
        row: dict[str, Any] = {"chunk_mib": mib}
        row["checksum"] = {name: checksum_speed(m, chunk, 3) for name, m in builds.items()}
        row["zmq"] = zmq_landing(chunk, args.rounds)
        row["tier"] = tier_landing(chunk, args.rounds)
        rows.append(row)
    load = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps({"benchmark": "payload_passes", "load_end": load, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
