"""Synthetic workloads for ``kvtier trace synth``: traces to try ``kvtier plan`` on.

* ``chat``: the multi-turn chat of ``kvtier bench`` (``kvtier.bench.workload``): waves of
  ``conversations`` conversations; each opens with a ``first_prompt``-token prompt (after an
  optional shared ``system``-token prompt), then runs ``rounds`` more turns, each appending the
  previous answer (``answer`` tokens) and a ``user``-token message; turn 0 of a wave first,
  then round after round, each round in a fresh random order.
* ``rag``: a shared ``system`` prompt, one of ``documents`` documents of ``document`` tokens
  (Zipf popularity, exponent ``zipf``), then a unique ``question``-token question.
* ``unique``: prompts of ``unique_prompt`` tokens (+-50%) that share nothing.
* ``mix``: each request is chat, rag or unique with probabilities ``mix`` (each kind keeps its
  own order, so chat turns still follow each other).

Requests arrive as a Poisson process of ``rate`` per second. Keys are synthetic but obey the
trace contract: a chunk's key names its whole prefix (a chunk that ends inside the system
prompt is shared by all; one that ends inside a document by every request on that document;
one that reaches the conversation or question is its own). Everything is generated with numpy
in bulk and written in one pass (about 1 s per 100k requests), on the caller's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

import numpy as np

from kvtier.plan.trace import MAX_LINE_BYTES, header_line

KINDS = ("chat", "rag", "unique", "mix")
_SYSTEM, _CHAT, _DOC, _REQ = 1, 2, 3, 4
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_SEP = np.frombuffer(b'","', dtype=np.uint8)


@dataclass(frozen=True)
class SynthSpec:
    """Sizes of a synthetic workload (tokens unless said otherwise)."""

    kind: str = "mix"
    requests: int = 10_000
    chunk_tokens: int = 64
    rate: float = 20.0
    seed: int = 0
    conversations: int = 16
    first_prompt: int = 768
    rounds: int = 4
    user: int = 32
    answer: int = 2
    system: int = 512
    documents: int = 1000
    document: int = 2048
    question: int = 64
    zipf: float = 1.1
    unique_prompt: int = 1024
    output: int = 128
    mix: tuple[float, float, float] = (0.4, 0.4, 0.2)


@dataclass
class _Requests:
    """Per request: prompt tokens, session, and the three key segments: chunks ending within
    ``shared`` tokens belong to ``entity1``, within ``middle`` tokens to ``entity2``, later
    ones to ``entity3`` (entities are tagged by kind in their top byte)."""

    prompt: np.ndarray
    session: np.ndarray
    shared: np.ndarray
    middle: np.ndarray
    entity1: np.ndarray
    entity2: np.ndarray
    entity3: np.ndarray

    def take(self, index: np.ndarray) -> _Requests:
        return _Requests(*(getattr(self, f)[index] for f in self.__dataclass_fields__))


def _tag(kind: int, ids: np.ndarray) -> np.ndarray:
    return (np.uint64(kind) << np.uint64(56)) | ids.astype(np.uint64)


def chat(spec: SynthSpec, n: int, rng: np.random.Generator) -> _Requests:
    turns, size = spec.rounds + 1, spec.conversations
    waves = -(-n // (turns * size))
    order = rng.permuted(np.tile(np.arange(size), (waves * turns, 1)), axis=1)
    wave = np.repeat(np.arange(waves * turns) // turns, size)
    turn = np.repeat(np.arange(waves * turns) % turns, size)
    conversation = (wave * size + order.reshape(-1))[:n]
    turn = turn[:n]
    prompt = spec.system + spec.first_prompt + turn * (spec.answer + spec.user)
    ones = np.ones(n, dtype=np.int64)
    return _Requests(
        prompt,
        conversation,
        ones * spec.system,
        prompt,
        _tag(_SYSTEM, ones * 0),
        _tag(_CHAT, conversation),
        _tag(_CHAT, conversation),
    )


def rag(spec: SynthSpec, n: int, rng: np.random.Generator, first_id: int) -> _Requests:
    doc = (rng.zipf(spec.zipf, n) - 1) % spec.documents
    ones = np.ones(n, dtype=np.int64)
    ids = np.arange(first_id, first_id + n)
    return _Requests(
        ones * (spec.system + spec.document + spec.question),
        ids,
        ones * spec.system,
        ones * (spec.system + spec.document),
        _tag(_SYSTEM, ones * 0),
        _tag(_DOC, doc),
        _tag(_REQ, ids),
    )


def unique(spec: SynthSpec, n: int, rng: np.random.Generator, first_id: int) -> _Requests:
    low, high = spec.unique_prompt // 2, spec.unique_prompt * 3 // 2 + 1
    ids = np.arange(first_id, first_id + n)
    zeros = np.zeros(n, dtype=np.int64)
    return _Requests(
        rng.integers(low, high, n),
        ids,
        zeros,
        zeros,
        _tag(_REQ, ids),
        _tag(_REQ, ids),
        _tag(_REQ, ids),
    )


def generate(spec: SynthSpec) -> _Requests:
    """The requests of ``spec``, in serving order."""
    rng = np.random.default_rng(spec.seed)
    n = spec.requests
    if spec.kind == "chat":
        return chat(spec, n, rng)
    if spec.kind == "rag":
        return rag(spec, n, rng, 0)
    if spec.kind == "unique":
        return unique(spec, n, rng, 0)
    kinds = rng.choice(3, n, p=np.array(spec.mix) / sum(spec.mix))
    parts = [
        chat(spec, int((kinds == 0).sum()), rng),
        rag(spec, int((kinds == 1).sum()), rng, 1 << 40),
        unique(spec, int((kinds == 2).sum()), rng, 2 << 40),
    ]
    order = np.argsort(kinds, kind="stable")
    merged = _Requests(
        *(np.concatenate([getattr(p, f) for p in parts]) for f in _Requests.__dataclass_fields__)
    )
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    return merged.take(inverse)


#: The most chunk keys (plus chat's conversation cells) one trace is generated with: about
#: 2.5 GiB of memory at the peak (~70 bytes a chunk), and a trace file of up to ~700 MB.
MAX_CELLS = 1 << 25
#: The most chunk keys one request line holds (19 bytes a key, 512 for the other fields, a time
#: of 300 digits included), so that no line is longer than ``kvtier plan`` reads by default.
LINE_KEYS = (MAX_LINE_BYTES - 512) // 19


def size_problem(spec: SynthSpec) -> str | None:
    """Why ``spec`` would write a line over ``MAX_LINE_BYTES`` (``LINE_KEYS``) or is too large
    to generate in memory (``MAX_CELLS``), or ``None``.

    Counts each request at its kind's longest prompt, so it errs on the large side.
    """
    kinds = list(_KIND_SIZES) if spec.kind == "mix" else [spec.kind]
    per_request = max(_KIND_SIZES[k](spec) for k in kinds) // spec.chunk_tokens
    if per_request > LINE_KEYS:
        return (
            f"a request would hold up to {per_request:,} chunks, more than the {LINE_KEYS:,} "
            f"of a {MAX_LINE_BYTES:,}-byte line (kvtier plan skips longer lines): lower the "
            "prompt sizes, or raise --chunk-tokens"
        )
    cells = spec.requests * per_request + (spec.rounds + 1) * spec.conversations * ("chat" in kinds)
    if cells <= MAX_CELLS:
        return None
    return (
        f"the trace would hold up to {cells:,} chunks, more than {MAX_CELLS:,}: lower "
        "--requests or the prompt sizes, or raise --chunk-tokens"
    )


#: The longest prompt of each kind, in tokens.
_KIND_SIZES: dict[str, Callable[[SynthSpec], int]] = {
    "chat": lambda s: s.system + s.first_prompt + s.rounds * (s.answer + s.user),
    "rag": lambda s: s.system + s.document + s.question,
    "unique": lambda s: s.unique_prompt * 3 // 2 + 1,
}


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijective scramble of 64-bit integers."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    result: np.ndarray = x ^ (x >> np.uint64(31))
    return result


def keys_of(reqs: _Requests, chunk_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, keys) of every full chunk of every request."""
    counts = reqs.prompt // chunk_tokens
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    request = np.repeat(np.arange(len(counts)), counts)
    pos = np.arange(offsets[-1], dtype=np.int64) - offsets[request]
    end = (pos + 1) * chunk_tokens
    entity = np.where(
        end <= reqs.shared[request],
        reqs.entity1[request],
        np.where(end <= reqs.middle[request], reqs.entity2[request], reqs.entity3[request]),
    )
    with np.errstate(over="ignore"):
        keys = _mix64(_mix64(entity) + pos.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    return offsets, keys


def _hex_rows(keys: np.ndarray) -> bytes:
    """Every key as 16 hex digits followed by ``","``, concatenated."""
    raw = keys.astype(">u8").view(np.uint8).reshape(-1, 8)
    digits = np.stack([_HEX[raw >> 4], _HEX[raw & 15]], axis=2).reshape(-1, 16)
    rows = np.concatenate([digits, np.broadcast_to(_SEP, (len(keys), 3))], axis=1)
    return rows.tobytes()


def write(spec: SynthSpec, out: IO[bytes]) -> int:
    """Write the trace of ``spec`` to ``out``; the number of requests written."""
    reqs = generate(spec)
    offsets, keys = keys_of(reqs, spec.chunk_tokens)
    rng = np.random.default_rng(spec.seed + 1)
    times = np.cumsum(rng.exponential(1.0 / spec.rate, spec.requests))
    out.write(header_line(spec.chunk_tokens, source=f"kvtier trace synth {spec.kind}").encode())
    rows = _hex_rows(keys)
    fields = zip(
        times.tolist(),
        reqs.prompt.tolist(),
        reqs.session.tolist(),
        offsets[:-1].tolist(),
        offsets[1:].tolist(),
        strict=True,
    )
    for r, (t, prompt, session, lo, hi) in enumerate(fields):
        body = b'"' + rows[lo * 19 : hi * 19 - 2] if hi > lo else b""
        out.write(
            b'{"t":%.4f,"id":%d,"session":%d,"prompt_tokens":%d,"output_tokens":%d,'
            b'"chunks":[%s]}\n' % (t, r, session, prompt, spec.output, body)
        )
    return spec.requests
