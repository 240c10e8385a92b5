"""The kvtier request trace: JSONL, one request per line, after an optional header line.

Version 1 of the format, precisely:

* Line 1 may be a **header**: ``{"kvtier_trace": 1, "chunk_tokens": 16, "source": "..."}``.
  ``kvtier_trace`` is the format version (only 1 exists); ``chunk_tokens`` (a positive integer,
  default 16) is how many tokens each chunk key of the ``chunks`` field covers; other keys are
  free-form notes. Without a header, readers assume ``chunk_tokens`` = 16 (or what they are told).
* Every other non-blank line is one **request**, a JSON object:

  ============== ==================================================================== ==========
  key            meaning                                                              required
  ============== ==================================================================== ==========
  ``t``          arrival time in seconds (a finite number >= 0; any origin)           yes
  ``id``         request id (string or integer)                                       no
  ``session``    session / conversation id (string or integer)                        no
  ``chunks``     the prompt's chunk keys: one per *full* chunk of ``chunk_tokens``     one of
                 tokens, each exactly 16 hex digits (64 bits), prefix-chained: key i  ``chunks``
                 identifies the whole prompt up to the end of chunk i (kvtier's own   or
                 ``chunk_keys`` and vLLM's block hashes are; use their first 8 bytes)  ``tokens``
  ``tokens``     the prompt's token ids (integers); keys are then computed by the
                 reader (chained xxh3-64 over each chunk's little-endian int64 ids)
  ``prompt_tokens`` prompt length in tokens; with ``chunks`` required and             with
                 ``prompt_tokens // chunk_tokens`` must equal ``len(chunks)``          ``chunks``
  ``output_tokens`` tokens generated for this request (integer >= 0, default 0)        no
  ============== ==================================================================== ==========

Lines are served in file order (times need not be sorted; they only date the chunks). A line
that breaks these rules is skipped and counted by reason; a line longer than
``MAX_LINE_BYTES`` is skipped without being held in memory.

In memory a trace is a ``Trace``: numpy arrays, keys as unsigned 64-bit integers, requests as
offsets into one flat key array, so millions of requests fit in a few hundred MiB.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import xxhash

FORMAT_VERSION = 1
DEFAULT_CHUNK_TOKENS = 16
#: The longest line read; longer ones are skipped (a 1M-token prompt of token ids fits).
MAX_LINE_BYTES = 16 << 20
MASK64 = (1 << 64) - 1

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "FORMAT_VERSION",
    "MAX_LINE_BYTES",
    "Trace",
    "TraceWriter",
    "header_line",
    "key_of",
    "keys_of_tokens",
]


@dataclass
class Trace:
    """Requests in serving order. Request ``r`` has keys ``keys[offsets[r]:offsets[r + 1]]``
    (its full chunks, in prompt order), ``prompt_tokens[r]`` and ``output_tokens[r]`` tokens,
    and arrived at ``times[r]``. ``skipped`` counts the lines that were left out, by reason."""

    chunk_tokens: int
    times: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    offsets: np.ndarray
    keys: np.ndarray
    skipped: Counter[str] = field(default_factory=Counter)
    header: dict[str, Any] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return len(self.times)

    @property
    def num_chunks(self) -> int:
        return len(self.keys)

    def chunks_per_request(self) -> np.ndarray:
        return np.diff(self.offsets)

    def usable_chunks(self) -> np.ndarray:
        """Chunks of each prompt a cache may serve: at most ``N - 1`` of ``N`` tokens (the model
        must compute the last one), so a prompt of exactly ``k`` full chunks can reuse ``k-1``."""
        usable: np.ndarray = np.maximum(self.prompt_tokens - 1, 0) // self.chunk_tokens
        result: np.ndarray = np.minimum(usable, self.chunks_per_request())
        return result

    @classmethod
    def from_requests(
        cls,
        requests: list[tuple[float, int, list[int]]],
        chunk_tokens: int,
        output_tokens: int = 0,
    ) -> Trace:
        """A trace from ``(t, prompt_tokens, keys)`` tuples (tests and small tools)."""
        lengths = [len(keys) for _, _, keys in requests]
        flat = [k & MASK64 for _, _, keys in requests for k in keys]
        return cls(
            chunk_tokens=chunk_tokens,
            times=np.array([t for t, _, _ in requests], dtype=np.float64),
            prompt_tokens=np.array([p for _, p, _ in requests], dtype=np.int64),
            output_tokens=np.full(len(requests), output_tokens, dtype=np.int64),
            offsets=np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64),
            keys=np.array(flat, dtype=np.uint64),
        )


def header_line(chunk_tokens: int, **notes: Any) -> str:
    """The header line (with its newline) of a version-1 trace."""
    return (
        json.dumps({"kvtier_trace": FORMAT_VERSION, "chunk_tokens": chunk_tokens, **notes}) + "\n"
    )


def key_of(key: bytes | int) -> int:
    """A chunk key as the trace's 64-bit integer: the first 8 bytes (big-endian) of a byte key,
    an integer key modulo 2**64."""
    if isinstance(key, int):
        return key & MASK64
    return int.from_bytes(bytes(key)[:8].ljust(8, b"\0"), "big")


def keys_of_tokens(tokens: np.ndarray, chunk_tokens: int) -> list[int]:
    """Chained 64-bit keys of every full chunk of ``tokens`` (int64): xxh3-64 of the chunk's
    little-endian ids, seeded with the previous key (0 for the first)."""
    raw = np.ascontiguousarray(tokens, dtype="<i8").tobytes()
    stride = chunk_tokens * 8
    keys, prev = [], 0
    for start in range(0, (len(raw) // stride) * stride, stride):
        prev = xxhash.xxh3_64_intdigest(raw[start : start + stride], seed=prev)
        keys.append(prev)
    return keys


def hex_keys(keys: np.ndarray) -> str:
    """The ``chunks`` JSON array of 64-bit keys: 16 hex digits each, as a trace line writes it."""
    raw = np.ascontiguousarray(keys, dtype=">u8").tobytes()
    return '["' + raw.hex(",", 8).replace(",", '","') + '"]' if raw else "[]"


class TraceWriter:
    """Writes a version-1 trace to an open text file: the header at once, then ``write`` lines.

    Not thread-safe; ``TraceRecorder`` wraps it for serving threads.
    """

    def __init__(self, file: IO[str], chunk_tokens: int, **notes: Any) -> None:
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens: expected a positive integer, got {chunk_tokens}")
        self.file, self.chunk_tokens = file, chunk_tokens
        file.write(header_line(chunk_tokens, **notes))

    def write(
        self,
        t: float,
        prompt_tokens: int,
        keys: np.ndarray | list[int],
        output_tokens: int = 0,
        request_id: str | int | None = None,
        session: str | int | None = None,
    ) -> None:
        """One request line; ``keys`` are 64-bit chunk keys (``len == prompt_tokens //
        chunk_tokens``)."""
        self.file.write(request_line(t, prompt_tokens, keys, output_tokens, request_id, session))


def request_line(
    t: float,
    prompt_tokens: int,
    keys: np.ndarray | list[int],
    output_tokens: int = 0,
    request_id: str | int | None = None,
    session: str | int | None = None,
) -> str:
    """One request line (with its newline); ``ValueError`` for a non-finite or negative time."""
    if not (math.isfinite(t) and t >= 0):
        raise ValueError(f"t: expected a finite time >= 0, got {t}")
    chunks = hex_keys(np.asarray(keys, dtype=np.uint64))
    head = f'{{"t":{t:.6f}'
    if request_id is not None:
        head += f',"id":{json.dumps(request_id)}'
    if session is not None:
        head += f',"session":{json.dumps(session)}'
    return (
        f'{head},"prompt_tokens":{int(prompt_tokens)},"output_tokens":{int(output_tokens)},'
        f'"chunks":{chunks}}}\n'
    )
