"""What the engine benches (``--engine vllm``, ``--engine sglang``) share: their workload
options and the order in which the strategies' engines serve the phases.

``interleave`` drives one engine per strategy, all started together and kept up: each phase
(``phase.phases``: every N of every round) is served by one engine after the other, so the
strategies' figures at one N are measured minutes apart at most, under the same load of a
shared machine. The order turns by one strategy at each N and reverses every other round
(``phase_order``): no strategy is always the first (or the last) to run, and at each N every
two strategies swap places from round to round.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class EngineBenchOptions:
    """The workload of an engine bench; capacities in conversations at their longest."""

    model: str = "small"
    conversations: tuple[int, ...] = (4, 8, 16)
    device_convs: float = 4
    host_convs: float = 8
    concurrency: int = 2
    first_prompt_tokens: int = 768
    rounds: int = 4
    user_turn_tokens: int = 32
    new_tokens: int = 8
    seed: int = 0
    mix: bool = False
    one_shot_tokens: int = 128
    output_dir: str = "bench-results"
    repeats: int = 1

    @property
    def max_context(self) -> int:
        """A conversation's largest KV in tokens: every prompt and answer."""
        asked = self.rounds * self.user_turn_tokens + (self.rounds + 1) * self.new_tokens
        return self.first_prompt_tokens + asked


def pool_sizes(per_conv: int, options: EngineBenchOptions) -> tuple[int, int, int]:
    """The device pool, the ceiling's pool and host memory of ``options`` in the unit of
    ``per_conv`` (one conversation at its longest): the device pool holds one at least, the
    ceiling every conversation plus the requests in flight, host memory one unit at least."""
    o = options
    device = max(per_conv, round(o.device_convs * per_conv))
    ceiling = (max(o.conversations) + o.concurrency) * per_conv
    return device, ceiling, max(1, round(o.host_convs * per_conv))


def run_dir(output_dir: str, engine: str) -> Path:
    """A fresh directory of its own for one run's files under ``output_dir``."""
    path = Path(output_dir) / f"{engine}-run-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


class EngineFailed(RuntimeError):
    """An engine exited with an error, failed a request, or wrote no report."""


class Engine(Protocol):
    """One strategy's engine as ``interleave`` drives it."""

    def ask(self, command: str | None, reply: str) -> None:
        """``None``: wait until it is up (``READY``); a phase index: serve it (``DONE``)."""

    def finish(self) -> dict[str, Any]:
        """Its report (``engine_report``'s input), with ``load_average_1m`` at its end."""

    def stop(self) -> None:
        """Stop it and remove what it left; idempotent, also after a failure."""


def rotated(names: list[str], turn: int) -> list[str]:
    """``names`` turned left by ``turn`` places."""
    turn %= max(1, len(names))
    return names[turn:] + names[:turn]


def phase_order(names: list[str], n_index: int, round_: int) -> list[str]:
    """The order in which the strategies serve the ``n_index``-th N of round ``round_``:
    ``names`` turned by ``n_index`` (no strategy always first), reversed in odd rounds, so that
    at each N any two strategies swap places from one round to the next (turning alone left
    one of two neighbours before the other in all but one of every ``len(names)`` phases)."""
    order = rotated(names, n_index)
    return order[::-1] if round_ % 2 else order


def interleave(
    start: Callable[[str], Engine], strategies: Sequence[str], phases: list[dict[str, Any]]
) -> dict[str, Any]:
    """Every strategy's report, in ``strategies``' order, after its engine (``start(strategy)``)
    served every phase (see the module docstring); every engine started is stopped afterwards,
    even when one failed."""
    engines: dict[str, Engine] = {}
    try:
        for strategy in strategies:
            engines[strategy] = start(strategy)
        for strategy, engine in engines.items():
            engine.ask(None, "READY")
            print(f"engine {strategy}: up", file=sys.stderr, flush=True)
        per_round = sum(phase["round"] == 0 for phase in phases)
        for index, phase in enumerate(phases):
            order = phase_order(list(engines), index % max(1, per_round), phase["round"])
            for strategy in order:
                engines[strategy].ask(str(index), "DONE")
                where = f"round {phase['round'] + 1} N={phase['conversations']}"
                print(f"{where} {strategy}: done", file=sys.stderr, flush=True)
        return {strategy: engine.finish() for strategy, engine in engines.items()}
    finally:
        for engine in engines.values():
            engine.stop()


def load_average() -> float:
    """The machine's 1-minute load average, rounded for a report."""
    return round(os.getloadavg()[0], 2)
