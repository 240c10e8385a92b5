"""Where kvtier's time goes on the engine's thread: per call of each step the transformers
integration takes (its own, the device cache's, the transfer engine's and the manager's entry
points), for host+fs and the ceiling taking turns request by request as in ``make bench``.
Prints JSON.

The bench's workload, capacities, seed and warm-up (prefetch on), ``--conversations``
conversations.
Each clocked call adds the calling thread's CPU (``time.thread_time``: the tier's I/O threads
and a busy machine move it little) and its wall time to the side whose request is running; a
wall time above the CPU time is time the engine's thread waited (for the GIL, for a CPU).
Per side and call: calls, then CPU and wall per request (ms); ``step`` is the whole request
(``StrategyRun.step``). Nested calls count in both (``TieredModel._restore`` holds
``HostCopies.copy_in``, which holds ``TransferEngine.submit_load``). ``host+fs - ceiling`` is the
difference of the wall times per request.

    PYTHONPATH=src .venv/bin/python benchmarks/engine_thread_calls.py --conversations 24
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from prefetch_ab import header

from kvtier.bench.engine import Strategy, StrategyRun
from kvtier.bench.runner import Bench, BenchOptions, take_turns
from kvtier.config.schema import TieringConfig
from kvtier.core.manager import TieringManager
from kvtier.device.staging import StackBuffer
from kvtier.device.transfer import TransferEngine
from kvtier.integrations.device_chunk_cache import DeviceChunkCache
from kvtier.integrations.hf_cache import CacheSession
from kvtier.integrations.host_copies import HostCopies
from kvtier.integrations.transformers import TieredModel

CLOCKED: dict[type, tuple[str, ...]] = {
    TieredModel: ("prefetch", "_keys", "_restore", "_store"),
    HostCopies: ("copy_in", "_claim", "lookup", "store"),
    DeviceChunkCache: ("claim", "put", "get"),
    TransferEngine: ("submit_load", "submit_store"),
    CacheSession: ("__init__", "forward", "pack"),
    StackBuffer: ("stack",),
    TieringManager: (
        "prefetch", "lookup", "prepare_load", "complete_load", "prepare_store", "complete_store",
        "touch",
    ),
}  # fmt: skip
SIDES = ("ceiling", "host+fs")


class Clocks:
    """CPU and wall seconds per (side, call); ``side`` is the strategy whose request runs."""

    def __init__(self) -> None:
        self.side: str | None = None
        self.calls: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.cpu: defaultdict[tuple[str, str], float] = defaultdict(float)
        self.wall: defaultdict[tuple[str, str], float] = defaultdict(float)

    def wrap(self, cls: type, name: str, label: str) -> None:
        fn = getattr(cls, name)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            side = self.side or (args[0].result.strategy if label == "step" else None)
            if side is None:
                return fn(*args, **kwargs)
            self.side, cpu, wall = side, time.thread_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.calls[side, label] += 1
                self.cpu[side, label] += time.thread_time() - cpu
                self.wall[side, label] += time.perf_counter() - wall
                if label == "step":
                    self.side = None

        setattr(cls, name, timed)


def strategies(bench: Bench, root: Path) -> list[Strategy]:
    caps = bench.capacities()
    fs = {"type": "fs", "root_dir": str(root / "fs")}
    config = {"cpu_bytes_to_use": caps["host_bytes"], "secondary_tiers": [fs]}
    return [
        Strategy("ceiling", None),
        Strategy("host+fs", caps["device_chunks"], TieringConfig.from_dict(config)),
    ]


def run(conversations: int, seed: int, root: Path) -> dict[str, Any]:
    bench = Bench(BenchOptions(seed=seed, output_dir=str(root)))
    spec = bench.options.spec(conversations, bench.vocab_size)
    bench.warm_up()  # as make bench does: first calls at each length, then the frozen heap
    clocks = Clocks()
    clocks.wrap(StrategyRun, "step", "step")
    for cls, names in CLOCKED.items():
        for name in names:
            clocks.wrap(cls, name, f"{cls.__name__}.{name}")
    starts = [
        functools.partial(StrategyRun, bench.model, bench.identity, strategy, spec, "calls")
        for strategy in strategies(bench, root)
    ]
    results = take_turns(starts, None)
    requests = {result.strategy: len(result.ttft_s) for result in results}
    return report(clocks, requests)


def report(clocks: Clocks, requests: dict[str, int]) -> dict[str, Any]:
    """Per side and call: calls, CPU and wall ms per request; then host+fs - ceiling (wall)."""

    def per_request(table: defaultdict[tuple[str, str], float], side: str, label: str) -> float:
        return round(1e3 * table[side, label] / requests[side], 3)

    labels = sorted({label for _, label in clocks.calls}, key=lambda k: -clocks.wall["host+fs", k])
    doc: dict[str, Any] = {"requests": requests}
    for side in SIDES:
        doc[side] = {
            label: {
                "calls": clocks.calls[side, label],
                "cpu_ms_per_request": per_request(clocks.cpu, side, label),
                "wall_ms_per_request": per_request(clocks.wall, side, label),
            }
            for label in labels
            if clocks.calls[side, label]
        }
    doc["host+fs - ceiling"] = {
        label: round(
            per_request(clocks.wall, "host+fs", label) - per_request(clocks.wall, "ceiling", label),
            3,
        )
        for label in labels
    }
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    args, load_before = parser.parse_args(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="engine-thread-calls-") as tmp:
        doc = run(args.conversations, args.seed, Path(tmp))
    print(json.dumps({**header(args.conversations, load_before), **doc}, indent=1))


if __name__ == "__main__":
    main()
