"""One SGLang server on this CPU, started and stopped by the SGLang bench and the tests.

``SglangServer.start`` runs ``python -m sglang.launch_server`` with an SGLang venv's python,
on the CPU (``SGLANG_USE_CPU_ENGINE=1``, ``--device cpu``), in its own session, with the
flags every run shares (``BASE_FLAGS``: no overlap schedule, no grammar backend, ``PAGE_SIZE``
token pages, ``--enable-metrics``, and ``--sleep-on-idle``: an idle scheduler otherwise polls
for requests on a whole core, and the bench keeps one idle server per strategy up) and the
caller's (pool sizes, HiCache, the L3 backend), and waits until ``/health_generate``
answers. SGLang 0.5.23 does not run HiCache on a CPU-only machine by itself: the ``shims``
folder (the repository's ``tests/integrations/sglang/shims``: a stand-in for SGLang's kernel
package, sgl-kernel, and a plugin that allocates the host pool as plain memory and copies
between device and host pools with torch indexing) goes first on its ``PYTHONPATH``.
A killed bench takes its servers with it (``orphans.die_with_parent``).
``stop`` ends the session and removes the ``sglang*`` files in /dev/shm that appeared while
it ran (stopped servers leave them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kvtier
from kvtier.bench.orphans import die_with_parent
from kvtier.bench.vllm_strategies import free_port

START_TIMEOUT_S = 420
PAGE_SIZE = 16
BASE_FLAGS = [
    "--device", "cpu", "--host", "127.0.0.1", "--disable-overlap-schedule",
    "--grammar-backend", "none", "--page-size", str(PAGE_SIZE), "--enable-metrics",
    "--sleep-on-idle",
]  # fmt: skip
SRC = Path(kvtier.__file__).resolve().parents[1]
#: The test-only shims of a source checkout (see the module docstring).
SHIMS = SRC.parent / "tests" / "integrations" / "sglang" / "shims"


def cpu_environ(shims: Path = SHIMS, **extra: str) -> dict[str, str]:
    """This process's environment for an SGLang server on the CPU: the shims, then kvtier's
    ``src``, on ``PYTHONPATH``; two OpenMP threads unless ``OMP_NUM_THREADS`` says otherwise."""
    return {
        **os.environ,
        "SGLANG_USE_CPU_ENGINE": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
        "PYTHONPATH": os.pathsep.join((str(shims), str(SRC))),
        **extra,
    }


class SglangServer:
    """One SGLang server (see the module docstring); ``stop`` is idempotent."""

    def __init__(
        self,
        python: Path,
        model: Path,
        workdir: Path,
        name: str,
        flags: list[str],
        environ: dict[str, str],
    ) -> None:
        self.python, self.model, self.workdir, self.name = python, model, workdir, name
        self.flags, self.environ = flags, environ
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.start_seconds = self._launched = 0.0
        self._shm_before: set[str] = set()

    @property
    def log(self) -> Path:
        return self.workdir / f"server-{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> SglangServer:
        """Start the server and return at once (``wait_ready`` waits for it)."""
        self._shm_before = _shm_files()
        command = [
            str(self.python), "-m", "sglang.launch_server", "--model-path", str(self.model),
            "--port", str(self.port), *BASE_FLAGS, *self.flags,
        ]  # fmt: skip
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                command, env=self.environ, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=die_with_parent(os.getpid()),
            )  # fmt: skip
        self._launched = time.perf_counter()
        return self

    def start(self) -> SglangServer:
        """``launch``, then ``wait_ready``."""
        return self.launch().wait_ready()

    def wait_ready(self) -> SglangServer:
        """Wait until it serves (``start_seconds``: since the launch); ``RuntimeError`` with
        its log's tail when it exits or is not up in ``START_TIMEOUT_S``."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"SGLang exited ({self.process.returncode}): {self.log_tail()}")
            try:
                urllib.request.urlopen(f"{self.url}/health_generate", timeout=30).read()
                self.start_seconds = time.perf_counter() - self._launched
                return self
            except OSError:
                time.sleep(2)
        self.stop()
        raise RuntimeError(f"SGLang did not start in {START_TIMEOUT_S} s: {self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def post(self, path: str, body: Any = None) -> Any:
        """POST ``body`` as JSON; the answer parsed as JSON (its bytes when it is not)."""
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
        """SIGTERM its session (SIGKILL after a minute); remove its /dev/shm files."""
        process, self.process = self.process, None
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
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
