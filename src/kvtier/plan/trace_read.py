"""Streaming reader of kvtier traces (format: ``kvtier.plan.trace``).

``read_trace(path)`` reads line by line (never more than ``MAX_LINE_BYTES`` of one line in
memory), parses lines in batches of ``BATCH_LINES`` with one ``json.loads`` call (falling back
to line by line when a batch does not parse, so one bad line costs only itself), and collects
keys into compact byte buffers that become numpy arrays at the end. Bad lines are skipped and
counted by reason in ``Trace.skipped``; a file that yields no request at all is a
``TraceError``, as is an unreadable file or an unknown format version.

Runs on the caller's thread; holds no state between calls.
"""

from __future__ import annotations

import json
import math
import os
import stat
from array import array
from collections import Counter
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

from kvtier.plan.trace import (
    DEFAULT_CHUNK_TOKENS,
    FORMAT_VERSION,
    MAX_LINE_BYTES,
    Trace,
    keys_of_tokens,
)

BATCH_LINES = 4096
MAX_CHUNK_TOKENS = 1 << 20
_TOO_LONG = b"\0too-long"


class TraceError(ValueError):
    """A trace that cannot be read at all (the message says why)."""


class _Requests:
    """Growing columns of the requests read so far."""

    def __init__(self) -> None:
        self.times, self.prompt, self.output = array("d"), array("q"), array("q")
        self.lengths = array("q")
        self.keys = bytearray()  # 8 bytes per key, big-endian

    def add(self, t: float, prompt: int, output: int, keys: bytes) -> None:
        self.times.append(t)
        self.prompt.append(prompt)
        self.output.append(output)
        self.lengths.append(len(keys) // 8)
        self.keys += keys

    def trace(self, chunk_tokens: int, skipped: Counter[str], header: dict[str, Any]) -> Trace:
        lengths = np.frombuffer(self.lengths, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return Trace(
            chunk_tokens=chunk_tokens,
            times=np.frombuffer(self.times, dtype=np.float64).copy(),
            prompt_tokens=np.frombuffer(self.prompt, dtype=np.int64).copy(),
            output_tokens=np.frombuffer(self.output, dtype=np.int64).copy(),
            offsets=offsets,
            keys=np.frombuffer(bytes(self.keys), dtype=">u8").astype(np.uint64),
            skipped=skipped,
            header=header,
        )


def read_trace(path: str | os.PathLike[str], chunk_tokens: int | None = None) -> Trace:
    """Read a whole trace. ``chunk_tokens`` applies to a trace without a header (default 16)."""
    with _open(path) as file:
        return _read(file, chunk_tokens or DEFAULT_CHUNK_TOKENS, str(path))


def _open(path: str | os.PathLike[str]) -> IO[bytes]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TraceError(f"trace {path}: {reason}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TraceError(f"trace {path}: not a regular file")
    return open(fd, "rb")


def _read(file: IO[bytes], chunk_tokens: int, name: str) -> Trace:
    skipped: Counter[str] = Counter()
    requests = _Requests()
    lines = _lines(file)
    header, first = _header(lines)
    tokens_per_chunk = int(header.get("chunk_tokens", chunk_tokens))
    batch = [] if first is None else [first]
    for line in lines:
        batch.append(line)
        if len(batch) >= BATCH_LINES:
            _take(batch, tokens_per_chunk, requests, skipped)
            batch = []
    _take(batch, tokens_per_chunk, requests, skipped)
    if not requests.times:
        raise TraceError(f"trace {name}: no requests ({_describe(skipped)})")
    return requests.trace(tokens_per_chunk, skipped, header)


def _describe(skipped: Counter[str]) -> str:
    if not skipped:
        return "the file is empty"
    total = sum(skipped.values())
    reasons = ", ".join(f"{n} {reason}" for reason, n in skipped.most_common(4))
    return f"{total} lines skipped: {reasons}"


def _lines(file: IO[bytes]) -> Iterator[bytes]:
    """Non-blank lines, stripped; a line over ``MAX_LINE_BYTES`` comes out as ``_TOO_LONG``."""
    while line := file.readline(MAX_LINE_BYTES + 1):
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while (rest := file.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass
            yield _TOO_LONG
            continue
        line = line.strip()
        if line:
            yield line


def _header(lines: Iterator[bytes]) -> tuple[dict[str, Any], bytes | None]:
    """The header (``{}`` if none) and the first line if it was a request instead."""
    first = next(lines, None)
    if first is None or b"kvtier_trace" not in first[:200]:
        return {}, first
    value = _parse_one(first)
    if not isinstance(value, dict) or "kvtier_trace" not in value:
        return {}, first
    version, tokens = value.get("kvtier_trace"), value.get("chunk_tokens", DEFAULT_CHUNK_TOKENS)
    if version != FORMAT_VERSION:
        raise TraceError(f"trace format version {version!r} (this kvtier reads version 1)")
    if type(tokens) is not int or not 1 <= tokens <= MAX_CHUNK_TOKENS:
        raise TraceError(f"trace header: chunk_tokens must be 1 to {MAX_CHUNK_TOKENS}")
    return value, None


def _take(batch: list[bytes], chunk_tokens: int, out: _Requests, skipped: Counter[str]) -> None:
    for value in _parse_batch(batch):
        result = request_fields(value, chunk_tokens)
        if isinstance(result, str):
            skipped[result] += 1
        else:
            out.add(*result)


class _Bad:
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _parse_batch(batch: list[bytes]) -> list[Any]:
    objects = [line for line in batch if line[:1] == b"{" and line[-1:] == b"}"]
    if len(objects) == len(batch) and batch:
        try:
            values = json.loads(b"[" + b",".join(batch) + b"]")
            if len(values) == len(batch):
                return list(values)
        except (ValueError, RecursionError):
            pass
    return [_parse_one(line) for line in batch]


def _parse_one(line: bytes) -> Any:
    if line is _TOO_LONG:
        return _Bad(f"lines over {MAX_LINE_BYTES >> 20} MiB")
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return _Bad("lines not JSON")


def request_fields(value: Any, chunk_tokens: int) -> tuple[float, int, int, bytes] | str:
    """``(t, prompt_tokens, output_tokens, keys as big-endian bytes)`` of one parsed line, or
    the reason it is skipped."""
    if isinstance(value, _Bad):
        return value.reason
    if not isinstance(value, dict):
        return "lines not a JSON object"
    t = value.get("t")
    if not isinstance(t, int | float) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
        return "requests without a finite time t >= 0"
    output = value.get("output_tokens", 0)
    if type(output) is not int or not 0 <= output < 1 << 40:
        return "requests with a bad output_tokens"
    if "chunks" in value:
        parsed = _chunk_keys(value, chunk_tokens)
    elif "tokens" in value:
        parsed = _token_keys(value, chunk_tokens)
    else:
        return "requests without chunks or tokens"
    if isinstance(parsed, str):
        return parsed
    return float(t), parsed[0], output, parsed[1]


def _chunk_keys(value: dict[str, Any], chunk_tokens: int) -> tuple[int, bytes] | str:
    chunks, prompt = value["chunks"], value.get("prompt_tokens")
    if type(prompt) is not int or not 0 <= prompt < 1 << 40:
        return "requests with chunks but no valid prompt_tokens"
    if not isinstance(chunks, list) or len(chunks) != prompt // chunk_tokens:
        return "requests whose chunks do not match prompt_tokens // chunk_tokens"
    try:
        text = "".join(chunks)
        if chunks and (len(text) != 16 * len(chunks) or min(map(len, chunks)) != 16):
            return "requests with chunk keys not of 16 hex digits"
        return prompt, bytes.fromhex(text)
    except (TypeError, ValueError):
        return "requests with chunk keys not of 16 hex digits"


def _token_keys(value: dict[str, Any], chunk_tokens: int) -> tuple[int, bytes] | str:
    tokens, prompt = value["tokens"], value.get("prompt_tokens")
    if not isinstance(tokens, list) or (prompt is not None and prompt != len(tokens)):
        return "requests with tokens that are not a list of prompt_tokens integers"
    if not all(type(x) is int and 0 <= x < 1 << 62 for x in tokens):
        return "requests with token ids that are not integers from 0 to 2**62"
    keys = keys_of_tokens(np.array(tokens, dtype=np.int64), chunk_tokens)
    return len(tokens), np.array(keys, dtype=">u8").tobytes()
