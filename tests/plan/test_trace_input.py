"""Trace files: round trips, and hostile input skipped with a count or refused clearly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvtier.plan.budget import MemoryBudget
from kvtier.plan.trace import TraceWriter, keys_of_tokens
from kvtier.plan.trace_read import TraceError, read_trace


def write(path: Path, *lines: str | bytes) -> Path:
    path.write_bytes(b"".join(x if isinstance(x, bytes) else x.encode() + b"\n" for x in lines))
    return path


def test_a_written_trace_reads_back(tmp_path: Path) -> None:
    with open(tmp_path / "t.jsonl", "w") as file:
        writer = TraceWriter(file, 16, source="test")
        writer.write(1.5, 40, [1, (1 << 64) - 1], 7, "r1", "s1")
        writer.write(2.0, 5, [])
    trace = read_trace(tmp_path / "t.jsonl")
    assert trace.chunk_tokens == 16 and trace.num_requests == 2
    assert trace.keys.tolist() == [1, (1 << 64) - 1]
    assert trace.prompt_tokens.tolist() == [40, 5] and trace.output_tokens.tolist() == [7, 0]
    assert trace.usable_chunks().tolist() == [2, 0]


def test_token_ids_become_chained_keys(tmp_path: Path) -> None:
    tokens = list(range(40))
    path = write(
        tmp_path / "t.jsonl",
        json.dumps({"kvtier_trace": 1, "chunk_tokens": 8}),
        json.dumps({"t": 0, "tokens": tokens}),
        json.dumps({"t": 1, "tokens": tokens[:17]}),
    )
    trace = read_trace(path)
    assert trace.keys.tolist() == keys_of_tokens(np.array(tokens), 8) + keys_of_tokens(
        np.array(tokens[:17]), 8
    )
    assert trace.keys[5] == trace.keys[0] and trace.keys[6] == trace.keys[1]


def test_bad_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    good = json.dumps({"t": 1, "prompt_tokens": 16, "chunks": ["00000000000000ff"]})
    path = write(
        tmp_path / "t.jsonl",
        good,
        "not json",
        "[1, 2]",
        '{"t": NaN, "tokens": [1]}',
        '{"t": -1, "tokens": [1]}',
        '{"t": 1}',
        '{"t": 1, "prompt_tokens": 16, "chunks": ["xyz"]}',
        '{"t": 1, "prompt_tokens": 99, "chunks": ["00000000000000ff"]}',
        '{"t": 1, "tokens": [1, "a"]}',
        '{"t": 1, "tokens": [1], "output_tokens": -3}',
        "[" * 100_000,
        b"\xff\xfe\x00garbage\n",
        good,
    )
    trace = read_trace(path)
    assert trace.num_requests == 2
    assert sum(trace.skipped.values()) == 11
    assert trace.skipped["requests without a finite time t >= 0"] == 2


def test_a_huge_line_is_skipped_without_being_held(tmp_path: Path) -> None:
    budget = MemoryBudget(256_000)  # lines of up to 1000 bytes
    good = json.dumps({"t": 1, "tokens": [1, 2, 3]})
    path = write(
        tmp_path / "t.jsonl", good, json.dumps({"t": 1, "tokens": list(range(5000))}), good
    )
    trace = read_trace(path, budget=budget)
    assert trace.num_requests == 2
    assert trace.skipped == {
        "lines over 1,000 bytes (the line limit of --memory-budget 250 KiB)": 1
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "the file is empty"),
        (b"\x00\x01\x02\xff" * 1000, "lines skipped"),
        (b'{"kvtier_trace": 1, "chunk_tokens": 16}\n', "no requests"),
        (b'{"kvtier_trace": 2}\n{"t": 1, "tokens": [1]}\n', "version 2"),
        (b'{"kvtier_trace": 1, "chunk_tokens": 0}\n', "chunk_tokens"),
    ],
)
def test_unusable_traces_are_refused_clearly(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_a_missing_file_or_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="No such file"):
        read_trace(tmp_path / "missing")
    with pytest.raises(TraceError, match="not a regular file"):
        read_trace(tmp_path)
