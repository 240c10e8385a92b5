"""Synthetic traces with known answers, and the peak memory of a child process."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import xxhash

from kvtier.plan.trace import Trace
from tests.child_process import child_env

MASK = (1 << 64) - 1


def key(*parts: int) -> int:
    """A deterministic 64-bit key (``hash`` of a tuple changes with PYTHONHASHSEED)."""
    return xxhash.xxh3_64_intdigest(repr(parts).encode())


def cyclic_docs(docs: int, chunks: int, requests: int, chunk_tokens: int) -> Trace:
    """Request i reads document i % docs (``chunks`` full chunks + 10 tokens): LRU reuse
    distance ``docs * chunks - 1`` chunks for every reuse."""
    rows = [
        (float(i), chunks * chunk_tokens + 10, [key(i % docs, c) for c in range(chunks)])
        for i in range(requests)
    ]
    return Trace.from_requests(rows, chunk_tokens)


def unique_prompts(requests: int, chunks: int, chunk_tokens: int) -> Trace:
    rows = [
        (float(i), chunks * chunk_tokens + 3, [key(-1, i, c) for c in range(chunks)])
        for i in range(requests)
    ]
    return Trace.from_requests(rows, chunk_tokens)


def shared_prefixes(requests: int, seed: int = 1, docs: int = 40) -> Trace:
    """Zipf-popular documents of 1 to 5 chunks, half with a unique tail chunk."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(requests):
        doc = int(rng.zipf(1.3)) % docs
        keys = [key(doc, i) for i in range(int(rng.integers(1, 6)))]
        if rng.random() < 0.5:
            keys.append(key(-2, r))
        rows.append((r * 0.1, len(keys) * 16 + int(rng.integers(0, 3)), keys))
    return Trace.from_requests(rows, 16)


#: Runs its arguments as its only child and prints that child's exit status and peak RSS.
_MEASURE = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True); "
    "sys.stderr.buffer.write(r.stderr); "
    "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def peak_rss(argv: list[str], timeout: float = 300) -> tuple[int, int, str]:
    """Run ``argv`` in a child of a fresh process (so no earlier child of the test run counts);
    its exit status, its peak resident memory in bytes, and its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
    )
    code, kib = done.stdout.split()
    return int(code), int(kib) * 1024, done.stderr
