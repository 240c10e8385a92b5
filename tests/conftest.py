"""Shared fixtures: a small layout, its identity, and helpers to fill and check host slots."""

from __future__ import annotations

import os
import random
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, TypeVar

import numpy as np
import pytest

from kvtier import (
    CacheIdentity,
    ChunkKey,
    KVLayout,
    StorePlan,
    TieringConfig,
    TieringManager,
    chunk_keys,
)
from kvtier.errors import KVTierError
from kvtier.region import HostRegion
from kvtier.tiers.base import RETRY, JobResult, Lookup, SecondaryTier

SMALL_LAYOUT = KVLayout(
    num_layers=2, num_kv_heads=2, head_dim=16, dtype="float32", block_size=4, blocks_per_chunk=2
)


@pytest.fixture
def layout() -> KVLayout:
    return SMALL_LAYOUT


@pytest.fixture
def identity(layout: KVLayout) -> CacheIdentity:
    return CacheIdentity(model="test/model", revision="r1", layout=layout)


def make_keys(identity: CacheIdentity, n: int, seed: int = 0) -> list[ChunkKey]:
    per_chunk = identity.layout.tokens_per_chunk
    tokens = np.random.default_rng(seed).integers(0, 50_000, size=n * per_chunk)
    return chunk_keys(tokens, identity)


def chunk_pattern(key: bytes, size: int) -> bytes:
    """Deterministic, key-specific bytes for a chunk of ``size`` bytes."""
    seed = int.from_bytes(key[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8).tobytes()


def fill(region: HostRegion, slot: int, key: bytes) -> None:
    region.view(slot)[:] = chunk_pattern(key, region.slot_bytes)


def holds(region: HostRegion, slot: int, key: bytes) -> bool:
    return bytes(region.view(slot)) == chunk_pattern(key, region.slot_bytes)


def store(m: TieringManager, keys: list[ChunkKey], success: bool = True) -> StorePlan:
    """``prepare_store`` + fill each slot with its key's pattern + ``complete_store``."""
    plan = m.prepare_store(keys)
    assert plan is not None
    for key, slot in zip(plan.keys, plan.slots, strict=True):
        fill(m.region, slot, key)
    m.complete_store(plan.keys, success=success)
    return plan


def settle(m: TieringManager, keys: list[ChunkKey], timeout: float = 20.0) -> int | Lookup:
    """``lookup`` until it stops answering RETRY (a deadline, not a speed bound)."""
    deadline = time.monotonic() + timeout
    while (n := m.lookup(keys)) is RETRY:
        assert time.monotonic() < deadline, f"lookup still answered RETRY after {timeout} s"
        time.sleep(0.002)
    return n


def read(m: TieringManager, keys: list[ChunkKey]) -> bool:
    """Load ``keys`` and check every slot holds its key's pattern."""
    slots = m.prepare_load(keys)
    ok = all(holds(m.region, slot, key) for key, slot in zip(keys, slots, strict=True))
    m.complete_load(keys)
    return ok


def push_out(m: TieringManager, identity: CacheIdentity, n: int, seed: int = 1000) -> None:
    """Store ``n`` unrelated chunks so that older ones leave host memory."""
    assert m.wait_idle(20)
    store(m, make_keys(identity, n, seed=seed))
    assert m.wait_idle(20)


def config(cpu_slots: int, layout: KVLayout = SMALL_LAYOUT, **extra: object) -> TieringConfig:
    stride = -(-layout.chunk_bytes // 4096) * 4096
    return TieringConfig.from_dict({"cpu_bytes_to_use": cpu_slots * stride, **extra})


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` until it holds; ``AssertionError`` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout:g} s")
        time.sleep(0.002)


def free_port() -> int:
    """A TCP port that was free a moment ago: bind it at once, and be ready to retry."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


T = TypeVar("T")


def on_a_free_port(bind: Callable[[int], T], attempts: int = 20) -> tuple[T, int]:
    """``(bind(port), port)`` for a port found free; another port if it was taken meanwhile.

    ``free_port`` releases its port before ``bind`` takes it, so another process may get there
    first; ``bind`` then raises (``OSError``, ``zmq.ZMQError``, or a kvtier error saying it
    "cannot listen") and another port is tried.
    """
    for _ in range(attempts - 1):
        port = free_port()
        try:
            return bind(port), port
        except Exception as exc:
            if not _port_taken(exc):
                raise
    port = free_port()
    return bind(port), port


def _port_taken(exc: BaseException) -> bool:
    if isinstance(exc, KVTierError):
        return "cannot listen" in str(exc)
    return isinstance(exc, OSError) or type(exc).__name__ == "ZMQError"


def read_line(
    proc: subprocess.Popen[bytes], timeout: float, what: str, stream: IO[bytes] | None = None
) -> bytes:
    """The next line ``proc`` writes on ``stream`` (default: its stdout; a pipe), no newline.

    ``AssertionError`` naming ``what`` if no whole line comes within ``timeout`` s, or if the
    process closes the stream first. Reads the pipe unbuffered, a byte at a time, so that what
    follows the line stays in the pipe for the next call.
    """
    stream = proc.stdout if stream is None else stream
    assert stream is not None
    fd, line = stream.fileno(), b""
    deadline = time.monotonic() + timeout
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{what}: no line within {timeout:g} s (got {line!r})")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1)
            if not chunk:
                code = proc.poll()
                raise AssertionError(f"{what}: the process closed the pipe (exit {code})")
            line += chunk
    return line[:-1]


def has_output(stream: IO[bytes], timeout: float) -> bool:
    """Whether ``stream`` (a pipe) has something to read within ``timeout`` s."""
    ready, _, _ = select.select([stream.fileno()], [], [], timeout)
    return bool(ready)


def freeze_process(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` and wait until every thread has stopped.

    ``kill`` returns once the signal is sent, not once it is obeyed: meanwhile a busy thread may
    still answer a request, which a test of a frozen peer must not see.
    """
    os.kill(pid, signal.SIGSTOP)
    tasks = Path(f"/proc/{pid}/task")
    wait_for(lambda: all(_stopped(task) for task in tasks.iterdir()), timeout)


def _stopped(task: Path) -> bool:
    try:
        state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True  # the thread is gone
    return state in ("T", "t")


def settle_lookup(tier: SecondaryTier, key: ChunkKey, timeout: float = 10.0) -> Lookup:
    """Ask ``tier`` until it answers something other than RETRY."""
    deadline = time.monotonic() + timeout
    while (answer := tier.lookup(key)) is RETRY:
        if time.monotonic() > deadline:
            raise AssertionError("lookup kept answering RETRY")
        time.sleep(0.002)
    return answer


def collect(
    tier: SecondaryTier, job_ids: Iterable[int], timeout: float = 20.0
) -> dict[int, JobResult]:
    """Poll ``tier`` until every job in ``job_ids`` has reported; fails on a duplicate result."""
    wanted, results = set(job_ids), {}
    deadline = time.monotonic() + timeout
    while wanted - results.keys():
        for result in tier.get_finished_jobs():
            assert result.job_id not in results, "a job result was handed out twice"
            results[result.job_id] = result
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs {sorted(wanted - results.keys())} never finished")
        time.sleep(0.002)
    return results


# -- test order: every test must pass alone and in any order ----------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--order",
        choices=("written", "reverse", "shuffle"),
        default="written",
        help="run the files, and the tests in each file, in reverse or shuffled order",
    )
    parser.addoption("--order-seed", type=int, default=None, help="seed for --order shuffle")


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.getoption("--order") == "shuffle":
        return f"test order: shuffled, --order-seed {_order_seed(config)}"
    return None


def _order_seed(config: pytest.Config) -> int:
    seed: int | None = config.getoption("--order-seed")
    if seed is None:
        seed = config.stash.setdefault(_SEED, random.randrange(1 << 32))
    return seed


_SEED = pytest.StashKey[int]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--order``: files stay whole (module fixtures are built once), but their order and
    the order of the tests in each are reversed or shuffled."""
    order = config.getoption("--order")
    if order == "written":
        return
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups = list(files.values())
    if order == "reverse":
        groups = [group[::-1] for group in groups[::-1]]
    else:
        rng = random.Random(_order_seed(config))
        rng.shuffle(groups)
        for group in groups:
            rng.shuffle(group)
    items[:] = [item for group in groups for item in group]
