"""The sweep of ``kvtier bench``: every strategy at every number of conversations.

Capacities are counted in conversations, so the three regimes land where the options say: the
accelerator pool holds ``device_convs`` conversations at their longest, host memory
``host_convs``, and a secondary tier (by default a filesystem directory under the output
directory, fresh for every run) holds the rest. Strategies, side by side in one run:

* ``recompute``: the accelerator pool only; whatever it evicted is recomputed;
* ``host``: plus kvtier's host tier;
* ``host+<tiers>``: plus the secondary tiers (``--config FILE``, or a filesystem tier);
* ``ceiling``: an accelerator pool that never evicts; the best this model can do.

At each N the strategies take turns, one request each, so that the load of a shared machine
falls on all of them alike.

Each run gets its own key salt, so nothing cached by one run is ever served to another.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import shutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.bench.engine import RunResult, Strategy, StrategyRun, build_model
from kvtier.bench.workload import WorkloadSpec
from kvtier.config.schema import TieringConfig
from kvtier.identity import CacheIdentity
from kvtier.integrations.transformers import identity_for, layout_for
from kvtier.region import ALIGNMENT, round_up
from kvtier.tiers.base import TierConfig
from kvtier.tiers.catalog import ExternalTierConfig

CEILING, RECOMPUTE, HOST = "ceiling", "recompute", "host"


@dataclass(frozen=True)
class BenchOptions:
    """Everything a sweep depends on; the defaults are what ``make bench`` runs."""

    model: str = "small"
    conversations: tuple[int, ...] = (2, 4, 8, 12, 16, 24)
    device_convs: float = 4.0
    host_convs: float = 12.0
    first_prompt_tokens: int = 768
    rounds: int = 4
    user_turn_tokens: int = 32
    new_tokens: int = 2
    block_size: int = 16
    blocks_per_chunk: int = 2
    config_path: str | None = None
    output_dir: str = "bench-results"
    threads: int = 1
    seed: int = 0
    prefetch: bool = True

    def spec(self, num_conversations: int, vocab_size: int) -> WorkloadSpec:
        return WorkloadSpec(
            num_conversations,
            self.first_prompt_tokens,
            self.rounds,
            self.user_turn_tokens,
            self.new_tokens,
            vocab_size,
            self.seed,
        )


#: ``kvtier bench --quick``: fewer and shorter conversations, under a minute.
QUICK = {
    "conversations": (2, 4, 8),
    "device_convs": 2.0,
    "host_convs": 4.0,
    "first_prompt_tokens": 512,
    "rounds": 3,
}


@dataclass
class Sweep:
    """The model's description, the capacities used, and one result per (N, strategy)."""

    options: BenchOptions
    identity: CacheIdentity
    capacities: dict[str, Any]
    strategies: list[str]
    results: list[RunResult]


class Bench:
    """Builds the model once, then runs ``strategies`` for each N in ``options.conversations``."""

    def __init__(self, options: BenchOptions) -> None:
        import torch

        torch.set_num_threads(options.threads)
        self.options = options
        self.model = build_model(options.model, seed=options.seed)
        self.vocab_size = int(self.model.config.vocab_size)
        path = options.config_path
        self.tiering = None if path is None else TieringConfig.load(path)
        blocks = options.blocks_per_chunk
        if self.tiering is not None:
            blocks = self.tiering.blocks_per_chunk_for(options.block_size) or blocks
        layout = layout_for(self.model, options.block_size, blocks)
        self.identity = identity_for(self.model, layout, name=f"kvtier-bench/{options.model}")
        self.tiers_dir = Path(options.output_dir) / "tiers"
        self._runs = 0
        #: Called with every run of the fullest tiered strategy when it starts (metrics export).
        self.on_full_run: Callable[[StrategyRun], None] | None = None

    @property
    def chunks_per_conversation(self) -> int:
        spec = self.options.spec(1, self.vocab_size)
        return math.ceil(spec.max_context_tokens / self.identity.layout.tokens_per_chunk)

    def capacities(self) -> dict[str, Any]:
        per_conv = self.chunks_per_conversation
        stride = round_up(self.identity.layout.chunk_bytes, ALIGNMENT)
        host_bytes = (
            self.tiering.cpu_bytes_to_use
            if self.tiering is not None
            else int(self.options.host_convs * per_conv) * stride
        )
        return {
            "chunk_tokens": self.identity.layout.tokens_per_chunk,
            "chunk_bytes": self.identity.layout.chunk_bytes,
            "chunks_per_conversation": per_conv,
            "device_chunks": int(self.options.device_convs * per_conv),
            "device_conversations": self.options.device_convs,
            "host_bytes": host_bytes,
            "host_conversations": host_bytes / (per_conv * stride),
        }

    def strategy_names(self) -> list[str]:
        tiers = self.tiering.secondary_tiers if self.tiering is not None else ()
        names = [_tier_label(t) for t in tiers] if tiers else ["fs"]
        return [RECOMPUTE, HOST, "+".join([HOST, *names]), CEILING]

    @contextmanager
    def strategies(self) -> Iterator[list[Strategy]]:
        """The strategies of one run; a default filesystem tier's directory lives as long."""
        caps = self.capacities()
        host = TieringConfig.from_dict({"cpu_bytes_to_use": caps["host_bytes"]})
        run_dir = self.tiers_dir / f"run-{self._runs}"
        full = self.tiering or TieringConfig.from_dict(
            {
                "cpu_bytes_to_use": caps["host_bytes"],
                "secondary_tiers": [{"type": "fs", "root_dir": str(run_dir / "fs")}],
            }
        )
        if self.tiering is not None:
            host = dataclasses.replace(self.tiering, secondary_tiers=())
        recompute, host_name, full_name, ceiling = self.strategy_names()
        try:
            yield [
                Strategy(recompute, caps["device_chunks"]),
                Strategy(host_name, caps["device_chunks"], host),
                Strategy(full_name, caps["device_chunks"], full),
                Strategy(ceiling, None),
            ]
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)

    def start(self, strategy: Strategy, num_conversations: int) -> StrategyRun:
        self._runs += 1
        spec = self.options.spec(num_conversations, self.vocab_size)
        salt = f"bench-run-{self._runs}"
        prefetch = self.options.prefetch
        run = StrategyRun(self.model, self.identity, strategy, spec, salt, prefetch=prefetch)
        if self.on_full_run is not None and strategy.name == self.strategy_names()[2]:
            self.on_full_run(run)
        return run

    def warm_up(self) -> None:
        """Run every prompt shape once (the first call at a new length is much slower), then
        freeze the heap so far out of the garbage collector's reach, as vLLM's engine core does
        after start-up: a full collection of the model's objects (about 0.2 s here) would
        otherwise land on one strategy's request at random."""
        with self.strategies() as strategies:
            for strategy in strategies[:3]:
                run = self.start(strategy, 1)
                while run.step():
                    pass
                run.close()
        gc.collect()
        gc.freeze()

    def sweep(self, progress: Any = None) -> Sweep:
        """Every strategy at every N; ``progress`` (a tqdm-like bar) ticks once per request."""
        results: list[RunResult] = []
        for num_conversations in self.options.conversations:
            if progress is not None:
                progress.set_description(f"{num_conversations} conversations")
            results += self._side_by_side(num_conversations, progress)
        return Sweep(self.options, self.identity, self.capacities(), self.strategy_names(), results)

    def _side_by_side(self, num_conversations: int, progress: Any) -> list[RunResult]:
        """All strategies at one N, taking turns request by request."""
        with self.strategies() as strategies:
            return take_turns(
                [lambda s=s: self.start(s, num_conversations) for s in strategies], progress
            )

    def num_requests(self) -> int:
        turns = self.options.rounds + 1
        return sum(n * turns for n in self.options.conversations) * len(self.strategy_names())


def _tier_label(tier: TierConfig) -> str:
    if isinstance(tier, ExternalTierConfig):
        return tier.name or tier.class_name
    return tier.name or tier.type_name


def take_turns(starts: list[Any], progress: Any) -> list[RunResult]:
    """Start every run (``starts`` are callables), step them in turn until all are done, close
    them whatever happens; their results. ``progress`` (a tqdm bar, or None) counts requests."""
    with ExitStack() as stack:
        runs = []
        for start in starts:
            runs.append(start())
            stack.callback(runs[-1].close)
        active = list(runs)
        while active:
            active = [run for run in active if run.step()]
            if progress is not None:
                progress.update(len(active))
        return [run.result for run in runs]
