"""Where kvtier's time goes on the engine's thread: thread CPU per call of each entry point the
transformers integration makes into the manager, in ``make bench``'s workload. Prints JSON.

One host+fs run of ``--conversations`` conversations (the bench's workload, its capacities
and seed, prefetch on) with each ``TieringManager`` entry point, and the promoter's prefetch
walk inside ``TieringManager.prefetch``, wrapped in a ``time.thread_time`` clock: CPU of the
calling thread only, so the tier's I/O threads and a busy machine move it less than wall time.
Per entry point: calls, CPU per call (µs) and per request (ms); then the run's requests and
wall seconds. Nested entry points count in both (``prefetch`` polls: ``_poll`` is inside it).

    PYTHONPATH=src .venv/bin/python benchmarks/engine_thread_calls.py --conversations 24
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from prefetch_ab import header

from kvtier.bench.engine import Strategy, StrategyRun
from kvtier.bench.runner import Bench, BenchOptions, take_turns
from kvtier.config.schema import TieringConfig
from kvtier.core import promotion
from kvtier.core.manager import TieringManager

ENTRY_POINTS = (
    "prefetch", "lookup", "prepare_load", "complete_load", "prepare_store", "complete_store",
    "touch", "_poll",
)  # fmt: skip


def clocked(cls: type, name: str, calls: Counter[str], cpu: defaultdict[str, float]) -> None:
    """Wrap ``cls.name`` so each call adds its thread CPU to ``cpu`` under ``Class.name``."""
    fn, label = getattr(cls, name), f"{cls.__name__}.{name}"

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            calls[label] += 1
            cpu[label] += time.thread_time() - start

    setattr(cls, name, timed)


def run(conversations: int, seed: int, root: Path) -> dict[str, Any]:
    bench = Bench(BenchOptions(seed=seed, output_dir=str(root)))
    caps = bench.capacities()
    fs = {"type": "fs", "root_dir": str(root / "fs")}
    config = {"cpu_bytes_to_use": caps["host_bytes"], "secondary_tiers": [fs]}
    strategy = Strategy("host+fs", caps["device_chunks"], TieringConfig.from_dict(config))
    spec = bench.options.spec(conversations, bench.vocab_size)
    calls: Counter[str] = Counter()
    cpu: defaultdict[str, float] = defaultdict(float)
    for name in ENTRY_POINTS:
        clocked(TieringManager, name, calls, cpu)
    clocked(promotion.Promoter, "prefetch", calls, cpu)
    started = time.perf_counter()
    (result,) = take_turns(
        [lambda: StrategyRun(bench.model, bench.identity, strategy, spec, "calls")], None
    )
    requests = len(result.ttft_s)
    per_call = {
        label: {
            "calls": calls[label],
            "cpu_us_per_call": round(1e6 * cpu[label] / calls[label], 1),
            "cpu_ms_per_request": round(1e3 * cpu[label] / requests, 3),
        }
        for label in sorted(cpu, key=lambda k: -cpu[k])
    }
    return {"requests": requests, "wall_s": round(time.perf_counter() - started, 2), **per_call}


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
