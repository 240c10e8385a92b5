"""Streaming reader of kvtier traces (format: ``kvtier.plan.trace``), within a memory budget.

``read_trace(path, budget=...)`` reads line by line, never more than ``budget.line_bytes`` of a
line: a longer line is skipped and counted without being held. Lines are parsed in batches of at
most ``budget.line_bytes`` bytes with one ``json.loads`` call (line by line when a batch does not
parse, so one bad line costs only itself), and keys are collected into compact byte buffers that
become numpy arrays at the end without a copy. So the reader holds the trace read so far (8 bytes
a key, 40 a request) plus at most ``PARSE_EXPANSION * budget.line_bytes`` while parsing. A trace
whose analysis would take more than ``budget.plan_bytes`` is refused as soon as the part read
shows it (``TraceError`` naming ``--memory-budget``): peak memory does not grow with the file.

Bad lines are skipped and counted by reason in ``Trace.skipped``; a file that yields no request
at all is a ``TraceError``, as is an unreadable file or an unknown format version.

Runs on the caller's thread; holds no state between calls.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import IO, Any

import numpy as np

from kvtier.plan.budget import MemoryBudget, text_of
from kvtier.plan.trace import DEFAULT_CHUNK_TOKENS, FORMAT_VERSION, Trace, keys_of_tokens

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
        """The columns as a ``Trace``; the buffers become its arrays (no copy of the keys)."""
        lengths = np.frombuffer(self.lengths, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        keys = np.frombuffer(self.keys, dtype=">u8")
        if sys.byteorder == "little":
            keys = keys.byteswap(inplace=True).view(np.uint64)
        return Trace(
            chunk_tokens=chunk_tokens,
            times=np.frombuffer(self.times, dtype=np.float64),
            prompt_tokens=np.frombuffer(self.prompt, dtype=np.int64),
            output_tokens=np.frombuffer(self.output, dtype=np.int64),
            offsets=offsets,
            keys=keys,
            skipped=skipped,
            header=header,
        )


def read_trace(
    path: str | os.PathLike[str],
    chunk_tokens: int | None = None,
    budget: MemoryBudget | None = None,
) -> Trace:
    """Read a whole trace within ``budget`` (default: ``MemoryBudget()``, 8 GiB).
    ``chunk_tokens`` applies to a trace without a header (default 16)."""
    with _open(path) as file:
        reader = _Reader(file, budget or MemoryBudget(), str(path))
        return reader.read(chunk_tokens or DEFAULT_CHUNK_TOKENS)


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


class _Reader:
    """One pass over an open trace file: its columns, skip counts and budget checks."""

    def __init__(self, file: IO[bytes], budget: MemoryBudget, name: str) -> None:
        self.file, self.budget, self.name = file, budget, name
        self.skipped: Counter[str] = Counter()
        self.requests = _Requests()
        self.too_long = f"lines over {budget.line_bytes:,} bytes (the line limit of {budget})"

    def read(self, chunk_tokens: int) -> Trace:
        lines = self._lines()
        header, first = _header(lines)
        tokens_per_chunk = int(header.get("chunk_tokens", chunk_tokens))
        rest = lines if first is None else chain([first], lines)
        for batch in _batches(rest, self.budget.line_bytes):
            self._take(batch, tokens_per_chunk)
            self._check_budget()
        if not self.requests.times:
            raise TraceError(f"trace {self.name}: no requests ({_describe(self.skipped)})")
        return self.requests.trace(tokens_per_chunk, self.skipped, header)

    def _lines(self) -> Iterator[bytes]:
        """Non-blank lines, stripped; a line over ``line_bytes`` comes out as ``_TOO_LONG``."""
        limit, file = self.budget.line_bytes, self.file
        while line := file.readline(limit + 1):
            if len(line) > limit and not line.endswith(b"\n"):
                while (rest := file.readline(min(limit + 1, 1 << 20))) and rest[-1:] != b"\n":
                    pass
                yield _TOO_LONG
                continue
            line = line.strip()
            if line:
                yield line

    def _take(self, batch: list[bytes], chunk_tokens: int) -> None:
        for value in _parse_batch(batch):
            result = self.too_long if value is _TOO_LONG else request_fields(value, chunk_tokens)
            if isinstance(result, str):
                self.skipped[result] += 1
            else:
                self.requests.add(*result)

    def _check_budget(self) -> None:
        """``TraceError`` once the requests read need more than the budget leaves the plan."""
        keys, requests = len(self.requests.keys) // 8, len(self.requests.times)
        need = self.budget.plan_needs(keys, requests)
        if need <= self.budget.plan_bytes:
            return
        read = self.file.tell()
        whole = need * max(1.0, os.fstat(self.file.fileno()).st_size / max(1, read))
        raise TraceError(
            f"trace {self.name}: too large for {self.budget}: its first {requests:,} requests "
            f"({keys:,} chunk keys, {text_of(read)} of the file) need {text_of(need)} to plan, "
            f"more than the {text_of(self.budget.plan_bytes)} it leaves for the trace and its "
            "analysis; raise --memory-budget (the whole file needs about "
            f"{text_of(MemoryBudget.total_for(int(whole)))}) or plan a part of the trace"
        )


def _batches(lines: Iterable[bytes], limit: int) -> Iterator[list[bytes]]:
    """``lines`` in lists of at most ``limit`` bytes (or one line, which is never longer)."""
    batch: list[bytes] = []
    size = 0
    for line in lines:
        if batch and size + len(line) > limit:
            yield batch
            batch, size = [], 0
        batch.append(line)
        size += len(line)
    if batch:
        yield batch


def _describe(skipped: Counter[str]) -> str:
    if not skipped:
        return "the file is empty"
    total = sum(skipped.values())
    reasons = ", ".join(f"{n} {reason}" for reason, n in skipped.most_common(4))
    return f"{total} lines skipped: {reasons}"


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
        return _TOO_LONG
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
    t = _time(value.get("t"))
    if t is None:
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
    return t, parsed[0], output, parsed[1]


def _time(t: Any) -> float | None:
    """``t`` as a finite time of at least 0, else ``None`` (an integer too large for a float
    is not one: ``math.isfinite`` would raise ``OverflowError`` on it)."""
    if not isinstance(t, int | float) or isinstance(t, bool):
        return None
    try:
        seconds = float(t)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


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
