"""Engine harness of ``kvtier bench``: one model, one strategy, one workload, timed.

A strategy is what the engine has besides the model: an accelerator-side KV pool of
``device_chunks`` chunks (the stand-in for HBM: the engine's own prefix cache, LRU), and
optionally a ``TieringConfig`` (host memory, plus any secondary tiers). Requests are served one
at a time through ``TieredModel``; each is timed from the call to its last generated token.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kvtier.bench.workload import Request, Workload, WorkloadSpec
from kvtier.config.schema import TieringConfig
from kvtier.core.manager import TieringManager
from kvtier.identity import CacheIdentity
from kvtier.integrations.device_chunk_cache import DeviceChunkCache
from kvtier.integrations.transformers import Generation, TieredModel

#: Llama-shaped models with random weights (head dim 64 throughout).
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1},
    "small": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 2},
    "base": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8,
             "num_attention_heads": 8, "num_key_value_heads": 2},
}  # fmt: skip


def build_model(name: str, vocab_size: int = 4096, seed: int = 0) -> Any:
    """A preset of ``MODEL_PRESETS`` (random weights), or a local model directory (real ones)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    model: Any
    if name in MODEL_PRESETS:
        torch.manual_seed(seed)
        shape = {"vocab_size": vocab_size, "max_position_embeddings": 16384, **MODEL_PRESETS[name]}
        model = LlamaForCausalLM(LlamaConfig(**shape))
    else:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
    return model.eval()


@dataclass(frozen=True)
class Strategy:
    """``device_chunks``: accelerator pool size (``None``: never evicts); ``tiering``: kvtier."""

    name: str
    device_chunks: int | None
    tiering: TieringConfig | None = None


@dataclass
class RunResult:
    """What one strategy did with one workload.

    ``tokens``: prompt plus generated tokens of every request; ``sources``: prompt tokens by
    origin (``follow_up_sources``: those of follow-up turns only); ``outputs``: the answer of
    each (conversation, turn).
    """

    strategy: str
    num_conversations: int
    seconds: float
    tokens: int
    ttft_s: list[float] = field(default_factory=list)
    follow_up_ttft_s: list[float] = field(default_factory=list)
    sources: Counter[str] = field(default_factory=Counter)
    follow_up_sources: Counter[str] = field(default_factory=Counter)
    outputs: dict[tuple[int, int], list[int]] = field(default_factory=dict, repr=False)
    stats: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def throughput(self) -> float:
        """Tokens per second."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class StrategyRun:
    """Serves the workload of ``spec`` with ``strategy``, one request per ``step``.

    Each request is timed on its own, from the call to the last generated token; the run's
    ``seconds`` is their sum. Runs of several strategies can then take turns request by request,
    so that a noisy, shared machine slows them all alike. Close the run to get its result.
    ``workload`` replaces ``Workload(spec)`` (e.g. a ``MixedWorkload`` built on ``spec``).
    With ``prefetch``, each step first hands the next request's prompt, where the workload
    already knows it, to ``TieredModel.prefetch``, as a serving engine with a queue would.
    """

    def __init__(
        self,
        model: Any,
        identity: CacheIdentity,
        strategy: Strategy,
        spec: WorkloadSpec,
        salt: str = "",
        workload: Workload | None = None,
        prefetch: bool = True,
    ) -> None:
        tiering = strategy.tiering
        self.manager = None if tiering is None else TieringManager(tiering, identity)
        device_cache = DeviceChunkCache(strategy.device_chunks)
        self.tiered = TieredModel(
            model, identity, self.manager, device_cache=device_cache, salt=salt
        )
        self.spec = spec
        self.workload = Workload(spec) if workload is None else workload
        self._requests = iter(self.workload)
        self.prefetch = prefetch
        self.result = RunResult(strategy.name, spec.num_conversations, 0.0, 0)

    def step(self) -> bool:
        """Serve the next request; ``False`` when none is left."""
        request = next(self._requests, None)
        if request is None:
            return False
        # the next prompt is the client's to build (not timed); prefetching it is the engine's
        upcoming = self.workload.upcoming() if self.prefetch and self.manager else None
        started = time.perf_counter()
        if upcoming is not None:  # its reads overlap this request's forward pass
            self.tiered.prefetch(upcoming)
        answer = self.tiered.generate(request.prompt, self.spec.new_tokens)
        self.result.seconds += time.perf_counter() - started
        self.workload.answer(request, answer.tokens)
        self._record(request, answer)
        return True

    def _record(self, request: Request, answer: Generation) -> None:
        result = self.result
        result.tokens += len(request.prompt) + len(answer.tokens)
        result.ttft_s.append(answer.first_token_s)
        if request.turn > 0:
            result.follow_up_ttft_s.append(answer.first_token_s)
            result.follow_up_sources.update(answer.sources)
        result.sources.update(answer.sources)
        result.outputs[(request.conversation, request.turn)] = answer.tokens

    def close(self) -> RunResult:
        """Drain pending stores and tier jobs (up to 30 s), take the manager's stats, close it;
        returns the result."""
        try:
            self.tiered.flush()
            if self.manager is not None:
                self.manager.wait_idle(30.0)  # writes through finished: counted in the stats
                self.result.stats = self.manager.stats()
        finally:
            if self.manager is not None:
                self.manager.close()
        return self.result


def serve(
    model: Any,
    identity: CacheIdentity,
    strategy: Strategy,
    spec: WorkloadSpec,
    *,
    salt: str = "",
    on_request: Callable[[], None] | None = None,
) -> RunResult:
    """Serve the whole workload of ``spec`` with ``strategy`` alone."""
    run = StrategyRun(model, identity, strategy, spec, salt)
    try:
        while run.step():
            if on_request is not None:
                on_request()
    finally:
        result = run.close()
    return result
