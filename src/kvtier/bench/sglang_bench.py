"""``kvtier bench --engine sglang``: each strategy's SGLang server serves every N.

``SglangBench(options).run()`` starts one SGLang server per strategy (``sglang_strategies``)
with the SGLang venv's python (``options.sglang_python``), all at once, then has them serve
each N in turn (``engine_bench.interleave``: only one serves at a time) from this process over
HTTP (``sglang_client``), and returns their reports by strategy. Every phase starts from empty
device and host caches (``/flush_cache``) and uses its own seed, so no phase is served what an
earlier one stored. After the last phase, each L3 strategy's server waits until its L3
directory stops growing, flushes L1 and L2 and replays the last phase's final prompts: its
report's ``l3_replay`` (``sglang_client.replay``). Every server is stopped afterwards, even when
one failed; a failed server raises ``EngineFailed`` with its log's tail. Every run gets fresh
L3 directories, so no run is served another's pages.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvtier.bench import engine_bench, phase, sglang_client
from kvtier.bench.engine_bench import EngineBenchOptions, EngineFailed
from kvtier.bench.phase import quiet_bytes, settle_writes
from kvtier.bench.sglang_server import SHIMS, SglangServer, cpu_environ
from kvtier.bench.sglang_strategies import L3_STRATEGIES, STRATEGIES, Pools, server_flags

DEFAULT_CACHE = Path.home() / ".cache" / "kvtier-test" / "sglang-cpu-0.5.23"
SETTLE_S = 3  # an L3 directory that did not grow for this long has every page SGLang backs up
SETTLE_TIMEOUT_S = 300
SETTLE_PHASE_LIMIT_S = 30  # after each phase: a backup still going after this runs on


def default_cache() -> Path:
    """``$KVTIER_SGLANG_CACHE``, else the folder ``make sglang-env`` builds."""
    return Path(os.environ.get("KVTIER_SGLANG_CACHE", DEFAULT_CACHE))


def default_sglang_python() -> str:
    """``$KVTIER_SGLANG_PYTHON``, else the venv of ``default_cache``."""
    return os.environ.get("KVTIER_SGLANG_PYTHON") or str(
        default_cache() / "venv" / "bin" / "python"
    )


@dataclass(frozen=True)
class SglangBenchOptions(EngineBenchOptions):
    """Options of the SGLang bench (``EngineBenchOptions``' workload); ``model`` is a model
    directory (default: the float32 SmolLM2 of ``make sglang-env``), ``shims`` the folder of
    the CPU shims (``sglang_server``)."""

    model: str = ""
    strategies: tuple[str, ...] = STRATEGIES
    sglang_python: str = ""
    shims: str = str(SHIMS)


#: ``--quick``: two sizes on either side of host memory, three turns.
QUICK: dict[str, Any] = {
    "conversations": (2, 8), "device_convs": 2, "host_convs": 4,
    "first_prompt_tokens": 512, "rounds": 2, "new_tokens": 4,
}  # fmt: skip


def absolute_paths(options: SglangBenchOptions) -> SglangBenchOptions:
    """``options`` with the output directory, the python, the model and the shims absolute
    (the defaults when unset); symbolic links kept (a venv's ``bin/python`` is one)."""
    return replace(
        options,
        output_dir=os.path.abspath(options.output_dir),
        sglang_python=os.path.abspath(options.sglang_python or default_sglang_python()),
        model=os.path.abspath(options.model or default_cache() / "smollm2"),
        shims=os.path.abspath(options.shims),
    )


class SglangBench:
    """One SGLang server per strategy over all N; see the module docstring."""

    def __init__(self, options: SglangBenchOptions) -> None:
        self.options = options = absolute_paths(options)
        self.workdir = engine_bench.run_dir(options.output_dir, "sglang")
        self.pools = Pools.size(options)

    def describe(self) -> str:
        """One line: the model, the pools, N, the strategies and where the files go."""
        p, o = self.pools, self.options
        return (
            f"SGLang bench: model {o.model}, a conversation is {p.tokens_per_conv} tokens; "
            f"device pool {p.device_tokens} tokens, host {p.host_tokens}, ceiling "
            f"{p.ceiling_tokens}; N = {','.join(map(str, o.conversations))}; strategies "
            f"{','.join(o.strategies)}; files under {self.workdir}"
        )

    def phases(self) -> list[dict[str, Any]]:
        """``phase.phases`` of the options (token ids below 32000: every model has them)."""
        return phase.phases(self.options, 32_000)

    def server(self, strategy: str) -> SglangServer:
        """The strategy's server, not started; its L3 directory is ``l3-<strategy>``."""
        o = self.options
        flags = server_flags(strategy, self.pools, self.workdir / f"l3-{strategy}")
        return SglangServer(
            Path(o.sglang_python), Path(o.model), self.workdir, strategy, flags,
            cpu_environ(Path(o.shims)),
        )  # fmt: skip

    def run(self) -> dict[str, dict[str, Any]]:
        """Every strategy's report, in ``options.strategies`` order (see the module
        docstring), with the machine's 1-minute load average when its server finished."""
        phases = self.phases()
        return engine_bench.interleave(
            lambda s: Engine(self.server(s).launch(), s, phases, self.options.concurrency),
            self.options.strategies,
            phases,
        )


class Engine:
    """One strategy's server driven as ``engine_bench.interleave`` drives an engine."""

    def __init__(
        self, server: SglangServer, strategy: str, phases: list[dict[str, Any]], concurrency: int
    ) -> None:
        self.server, self.strategy, self.phases = server, strategy, phases
        self.concurrency = concurrency
        self.done: dict[int, dict[str, Any]] = {}

    @property
    def l3_dir(self) -> Path:
        return self.server.workdir / f"l3-{self.strategy}"

    def ask(self, command: str | None, reply: str) -> None:
        """``None``: wait until the server is up and warmed; else serve phase ``command``."""
        try:
            if command is None:
                self.server.wait_ready()
                self._warm_up()
                return
            self.server.flush()
            index = int(command)
            self.done[index] = sglang_client.run_phase(
                self.server, self.phases[index], self.concurrency
            )
            written = [str(self.l3_dir)] if self.strategy in L3_STRATEGIES else []
            # SGLang backs up in batches: its own quiet time, not the default 0.25 s
            settled = settle_writes(written, SETTLE_S, SETTLE_PHASE_LIMIT_S)
            self.done[index]["settle_seconds"] = settled
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            raise EngineFailed(
                f"SGLang {self.strategy} failed ({exc!r}), log {self.server.log}:\n"
                f"{self.server.log_tail(3000)}"
            ) from exc

    def _warm_up(self) -> None:
        """A first-prompt-sized request outside the measurement (first-call costs)."""
        first = self.phases[0]
        sglang_client.generate(
            self.server.port, list(range(10, 10 + first["first_prompt_tokens"])), 2
        )

    def finish(self) -> dict[str, Any]:
        """The report: the phases, the L3 directory's bytes, ``l3_replay`` for an L3
        strategy, the server's start seconds and the load average."""
        report: dict[str, Any] = {
            "load_seconds": self.server.start_seconds,
            "phases": [self.done[i] for i in sorted(self.done)],
            "disk_bytes": {},
        }
        if self.strategy in L3_STRATEGIES:
            report["disk_bytes"][self.strategy] = self._settled_bytes()
            self.server.flush()
            report["l3_replay"] = sglang_client.replay(self.server, report["phases"][-1]["finals"])
        report["load_average_1m"] = engine_bench.load_average()
        return report

    def _settled_bytes(self) -> int:
        """The L3 directory's bytes once it stopped growing (SGLang backs up asynchronously)."""
        return quiet_bytes([str(self.l3_dir)], SETTLE_S, SETTLE_TIMEOUT_S)

    def stop(self) -> None:
        self.server.stop()
