"""kvtier as the L3 of a real SGLang 0.5.23 engine on this CPU (three server starts in all).

A (fs tier, /metrics and the admin endpoint): a cold prompt is written to L3; after a flush of
SGLang's device and host caches it is served from L3 with output identical to the cold run;
with the fs tier switched off by the admin endpoint it is recomputed, same output; a second
prompt whose chunk files are then damaged is recomputed after a flush, same output.
B (a restart over A's directory): the first prompt is served from L3, same output.
C (the same L3 directory and revision, KV in bfloat16, SGLang's own fault injection on every
storage call): 0 L3 hits for the first prompt (another identity), and repeated flushed runs do
not hang and give the same output. (Another ``revision`` is a separate cache too:
test_backend.py.)
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.bench.vllm_strategies import free_port
from tests.integrations.sglang.engine import Server, SglangEnv, storage_config

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(1800)]  # three engine starts

WORDS = " ".join(f"item{i} is the {i % 7}th colour of tile {i * 13 % 97};" for i in range(40))
FIRST = "Here is a long inventory list. " + WORDS + " Now list the tiles in reverse order:"
SECOND = "A different list entirely. " + WORDS.replace("tile", "brick") + " Summarize it:"


def chunk_files(l3: Path) -> set[Path]:
    return {p for p in l3.rglob("*") if p.is_file() and len(p.name) == 64}


def wait_stored(l3: Path, before: set[Path], server: Server) -> set[Path]:
    """The chunk files a request added, once SGLang's backup thread stopped adding them."""
    last: set[Path] = set()
    for _ in range(120):
        now = chunk_files(l3) - before
        if now and now == last:
            return now
        last = now
        time.sleep(1)
    raise AssertionError(f"nothing was written to L3: {server.log_tail()}")


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        server.stop()


def start(servers: list[Server], server: Server) -> Server:
    servers.append(server)
    return server.start()


def served_from_l3(server: Server, prompt: str) -> tuple[list[int], int]:
    """The prompt after a flush; once more if L3 missed (SGLang revokes a prefetch that did not
    finish in time, e.g. while a fresh server's tiers still probe)."""
    server.flush()
    output, storage = server.generate(prompt)
    if storage == 0:
        server.flush()
        output, storage = server.generate(prompt)
    return output, storage


def admin(port: int, path: str) -> bytes:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", b"", method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return bytes(answer.read())


def test_sglang_serves_from_kvtier(
    sglang_env: SglangEnv, sglang_workdir: Path, servers: list[Server]
) -> None:
    began = time.perf_counter()
    l3 = sglang_workdir / "l3"
    port = free_port()
    config = storage_config(l3, metrics_port=port, metrics_admin=True)
    a = start(servers, Server(sglang_env, sglang_workdir, "a", config))
    cold, storage = a.generate(FIRST)
    assert storage == 0
    first_files = wait_stored(l3, set(), a)
    warm, storage = served_from_l3(a, FIRST)
    assert warm == cold and storage > 0, a.log_tail()
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    assert 'kvtier_prompt_tokens_total{source="fs"}' in metrics, metrics[-3000:]

    admin(port, "/admin/tiers/fs/disable")
    a.flush()
    assert a.generate(FIRST) == (cold, 0)  # switched off: recomputed, same output
    admin(port, "/admin/tiers/fs/enable")

    second_cold, _ = a.generate(SECOND)
    for path in wait_stored(l3, first_files, a):  # damage every chunk of the second prompt
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    a.flush()
    assert a.generate(SECOND) == (second_cold, 0)
    a.stop()

    b = start(servers, Server(sglang_env, sglang_workdir, "b", config))
    again, storage = b.generate(FIRST)
    if storage == 0:
        again, storage = served_from_l3(b, FIRST)
    assert again == cold and storage > 0, b.log_tail()
    b.stop()

    faults = {
        "SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE": "0.3",
        "SGLANG_TEST_HICACHE_BACKEND_RANDOM_DELAY": "0.05",
    }
    bf16 = ["--dtype", "bfloat16"]  # the KV dtype SGLang's own keys leave out (#33268)
    c = start(servers, Server(sglang_env, sglang_workdir, "c", config, bf16, environ=faults))
    c_cold, storage = c.generate(FIRST)
    assert storage == 0  # another identity: nothing of A's float32 pages is served
    for _ in range(3):
        c.flush()
        assert c.generate(FIRST)[0] == c_cold
    c.stop()
    starts = f"a {a.start_seconds:.0f} s, b {b.start_seconds:.0f} s, c {c.start_seconds:.0f} s"
    print(f"\nSGLang starts: {starts}; the whole test {time.perf_counter() - began:.0f} s")
