"""The SGLang test venv and real SGLang servers for the end-to-end tests.

``SglangEnv.build`` builds (or reuses) the cached venv and model with ``build_env.sh`` (flock'd:
one build at a time, whoever asks). ``Server`` starts ``python -m sglang.launch_server`` on the
CPU with HiCache (L2 host pool) and kvtier as its L3 (``--hicache-storage-backend dynamic``),
the test-only shims on ``PYTHONPATH`` (``shims/README.md``), in its own session, and stops it
with the ``sglang_*`` files it left in /dev/shm (the ones that appeared while it ran).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtier.bench.vllm_strategies import free_port
from tests.integrations.cached_venv import build_cached_venv

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SHIMS = HERE / "shims"
SGLANG_VERSION = "0.5.23"
START_TIMEOUT_S = 420
PAGE_SIZE = 16


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
        return {
            **os.environ,
            "SGLANG_USE_CPU_ENGINE": "1",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
            "PYTHONPATH": f"{SHIMS}:{ROOT}",
            **extra,
        }

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


@dataclass
class Server:
    """One SGLang server (see the module docstring); ``stop`` is idempotent."""

    env: SglangEnv
    workdir: Path
    name: str
    extra_config: dict[str, Any]
    flags: list[str] = field(default_factory=list)
    environ: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    start_seconds: float = 0.0
    _shm_before: set[str] = field(default_factory=set)

    def start(self) -> Server:
        self._shm_before = _shm_files()
        log = (self.workdir / f"server-{self.name}.log").open("wb")
        command = [
            str(self.env.python), "-m", "sglang.launch_server", "--device", "cpu",
            "--model-path", str(self.env.model), "--host", "127.0.0.1", "--port", str(self.port),
            "--disable-overlap-schedule", "--grammar-backend", "none", "--max-total-tokens", "8192",
            "--page-size", str(PAGE_SIZE), "--enable-hierarchical-cache", "--enable-metrics",
            "--hicache-storage-backend", "dynamic",
            "--hicache-storage-backend-extra-config", json.dumps(self.extra_config), *self.flags,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, env=self.env.environ(**self.environ), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        started = time.perf_counter()
        self._wait_ready()
        self.start_seconds = time.perf_counter() - started
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"SGLang exited ({self.process.returncode}): {self.log_tail()}")
            try:
                urllib.request.urlopen(f"{self.url}/health_generate", timeout=30).read()
                return
            except OSError:
                time.sleep(2)
        self.stop()
        raise RuntimeError(f"SGLang did not start in {START_TIMEOUT_S} s: {self.log_tail()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 4000) -> str:
        path = self.workdir / f"server-{self.name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def post(self, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        request = urllib.request.Request(
            f"{self.url}{path}", data, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=600) as answer:
            text = answer.read()
        try:
            return json.loads(text)
        except ValueError:
            return text

    def generate(self, prompt: str, max_new_tokens: int = 8) -> tuple[list[int], int]:
        """Greedy output ids and the prompt tokens SGLang served from L3 (``storage``)."""
        params = {"max_new_tokens": max_new_tokens, "temperature": 0}
        answer = self.post("/generate", {"text": prompt, "sampling_params": params})
        details = answer["meta_info"].get("cached_tokens_details") or {}
        return list(answer["output_ids"]), int(details.get("storage") or 0)

    def flush(self) -> None:
        """Empty SGLang's device and host caches (L1, L2); L3 keeps everything. SGLang refuses
        (400) while a request is still finishing, so this asks again until it is done."""
        for _ in range(120):
            try:
                self.post("/flush_cache")
                return
            except urllib.error.HTTPError as exc:
                if exc.code != 400:
                    raise
                time.sleep(0.5)
        raise RuntimeError(f"SGLang never flushed its cache: {self.log_tail()}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)  # the session this server started
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        except ProcessLookupError:
            pass
        for name in _shm_files() - self._shm_before:
            Path("/dev/shm", name).unlink(missing_ok=True)


def _shm_files() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("sglang")}
    except OSError:
        return set()
