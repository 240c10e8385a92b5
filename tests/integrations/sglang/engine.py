"""The SGLang test venv and real SGLang servers for the end-to-end tests.

``SglangEnv.build`` builds (or reuses) the cached venv and model with ``build_env.sh`` (flock'd:
one build at a time, whoever asks). ``Server`` is the bench's ``SglangServer`` (on the CPU, the
test-only shims on ``PYTHONPATH``: ``shims/README.md``) with HiCache (L2 host pool) and kvtier
as its L3 (``--hicache-storage-backend dynamic``).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.bench.sglang_server import SglangServer, cpu_environ
from tests.integrations.cached_venv import build_cached_venv

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SHIMS = HERE / "shims"
SGLANG_VERSION = "0.5.23"


@dataclass(frozen=True)
class SglangEnv:
    python: Path
    model: Path
    build_seconds: float

    @classmethod
    def build(cls) -> SglangEnv:
        """Build (or reuse) the cached venv and model; ``RuntimeError`` with the log if it fails."""
        return cls(
            *build_cached_venv(
                HERE / "build_env.sh", "KVTIER_SGLANG_CACHE", f"sglang-cpu-{SGLANG_VERSION}"
            )
        )

    def environ(self, **extra: str) -> dict[str, str]:
        """``cpu_environ`` with the repository root on ``PYTHONPATH`` too (``tests``)."""
        environ = cpu_environ(SHIMS, **extra)
        return {**environ, "PYTHONPATH": f"{environ['PYTHONPATH']}:{ROOT}"}

    def run(
        self, script: Path, *args: str, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """``script`` in the SGLang venv (the shims importable), its output captured."""
        command = [str(self.python), str(script), *args]
        return subprocess.run(
            command, env=self.environ(), capture_output=True, text=True, timeout=timeout
        )


def storage_config(l3_dir: Path, **kvtier: Any) -> dict[str, Any]:
    """The extra config of ``--hicache-storage-backend dynamic`` with kvtier's fs tier."""
    tiers = [{"type": "fs", "root_dir": str(l3_dir)}]
    return {
        "backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
        "class_name": "KvtierHiCacheStorage", "interface_v1": 1,
        "prefetch_timeout_base": 10,
        "kvtier": {"secondary_tiers": tiers, **kvtier},
    }  # fmt: skip


class Server(SglangServer):
    """``SglangServer`` with HiCache (L2 host pool) and ``extra_config``'s dynamic L3 backend,
    8192 tokens of device pool, plus ``flags``; ``environ`` adds to the test environment."""

    def __init__(
        self,
        env: SglangEnv,
        workdir: Path,
        name: str,
        extra_config: dict[str, Any],
        flags: list[str] | None = None,
        environ: dict[str, str] | None = None,
    ) -> None:
        hicache = [
            "--max-total-tokens", "8192", "--enable-hierarchical-cache",
            "--hicache-storage-backend", "dynamic",
            "--hicache-storage-backend-extra-config", json.dumps(extra_config), *(flags or []),
        ]  # fmt: skip
        super().__init__(
            env.python, env.model, workdir, name, hicache, env.environ(**(environ or {}))
        )

    def generate(self, prompt: str, max_new_tokens: int = 8) -> tuple[list[int], int]:
        """Greedy output ids and the prompt tokens SGLang served from L3 (``storage``)."""
        params = {"max_new_tokens": max_new_tokens, "temperature": 0}
        answer = self.post("/generate", {"text": prompt, "sampling_params": params})
        details = answer["meta_info"].get("cached_tokens_details") or {}
        return list(answer["output_ids"]), int(details.get("storage") or 0)
