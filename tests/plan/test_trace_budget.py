"""``kvtier plan`` within ``--memory-budget`` (issue 25, finding 3): the reader streams, a line
over the budget's limit is skipped and counted, a trace too large for the budget is refused
while it is read, and running out of memory names the budget, not ``--exact-limit``.

Memory is measured as the peak RSS of a child process, with wide margins; nothing is timed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvtier.plan import analysis
from kvtier.plan.budget import (
    MIN_MEMORY_BUDGET,
    PARSE_EXPANSION,
    PLAN_BYTES_PER_KEY,
    PLAN_BYTES_PER_REQUEST,
    MemoryBudget,
)
from kvtier.plan.synth import LINE_KEYS, SynthSpec, size_problem, write
from kvtier.plan.trace_read import TraceError, read_trace
from tests.cli_run import run
from tests.plan.helpers import peak_rss

MiB = 1 << 20
CLI = [sys.executable, "-m", "kvtier.cli"]
PLAN = ["--no-chart", "--target", "vllm-cuda"]
HEADER = json.dumps({"kvtier_trace": 1, "chunk_tokens": 16})


def request(t: float, *keys: int, pad: int = 0) -> str:
    """A request line of ``keys`` (as 16 hex digits), its id ``pad`` characters long."""
    chunks = [f"{k:016x}" for k in keys]
    value = {"t": t, "id": "x" * pad, "prompt_tokens": 16 * len(keys), "chunks": chunks}
    return json.dumps(value, separators=(",", ":"))


def sized(length: int, t: float = 5.0) -> str:
    """A valid request line exactly ``length`` bytes long."""
    bare = request(t, 7)
    return request(t, 7, pad=length - len(bare))


def test_planning_a_trace_of_huge_lines_holds_one_line_at_a_time(tmp_path: Path) -> None:
    """Before: 4,096 lines of up to 16 MiB were parsed at once, 7x the file (144 MiB took
    1,005 MiB). Now a batch holds at most one such line, whatever the file's size."""
    bad = b'{"t":1,"prompt_tokens":16,"chunks":[' + b",".join([b'"0123456789abcdef"'] * 660_000)
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as out:
        out.write(f"{HEADER}\n{request(0, 1, 2)}\n{request(1, 1, 3)}\n".encode())
        for _ in range(12):  # 12 MiB each: read, parsed and skipped (wrong prompt_tokens)
            out.write(bad + b"]}\n")
    assert path.stat().st_size > 140 * MiB
    argv = [*CLI, "plan", str(path), *PLAN, "--output-dir", str(tmp_path / "out")]
    code, peak, err = peak_rss(argv)
    assert code == 0, err
    assert peak < 400 * MiB, f"peak RSS {peak / MiB:.0f} MiB for a {path.stat().st_size} file"


def test_a_trace_too_large_for_the_budget_is_refused_within_it(tmp_path: Path) -> None:
    """A 100 MB trace under a 64 MiB budget: refused after the part that fits, with the
    budget named; memory does not follow the file."""
    path = tmp_path / "mix.jsonl"
    with open(path, "wb") as out:
        write(SynthSpec(requests=160_000), out)
    assert path.stat().st_size > 95 * MiB
    argv = [*CLI, "plan", str(path), *PLAN, "--memory-budget", "64MiB"]
    code, peak, err = peak_rss([*argv, "--output-dir", str(tmp_path / "out")])
    assert code == 2 and "Traceback" not in err, err
    assert "too large for --memory-budget 64 MiB" in err and "raise --memory-budget" in err
    assert peak < 64 * MiB + 150 * MiB, f"peak RSS {peak / MiB:.0f} MiB"


def fitting(budget: MemoryBudget) -> int:
    """How many one-key requests the budget plans."""
    per_request = PLAN_BYTES_PER_KEY + PLAN_BYTES_PER_REQUEST
    return (budget.total - budget.line_bytes * PARSE_EXPANSION) // per_request


@pytest.mark.parametrize("extra", [0, 1])
def test_the_budget_plans_exactly_what_fits(tmp_path: Path, extra: int) -> None:
    budget = MemoryBudget(1 * MiB)
    count = fitting(budget) + extra
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([HEADER, *(request(i, i + 1) for i in range(count))]) + "\n")
    if extra:
        with pytest.raises(TraceError, match="too large for --memory-budget 1 MiB"):
            read_trace(path, budget=budget)
    else:
        assert read_trace(path, budget=budget).num_requests == count


@pytest.mark.parametrize("newline", [True, False])
def test_a_line_at_the_limit_is_read_and_one_byte_longer_skipped(
    tmp_path: Path, newline: bool
) -> None:
    budget = MemoryBudget(MIN_MEMORY_BUDGET)
    limit = budget.line_bytes
    path = tmp_path / "t.jsonl"
    lines = [HEADER, request(0, 1), sized(limit, 1.0), sized(limit + 1, 2.0)]
    text = "\n".join(lines) + ("\n" if newline else "")
    path.write_text(text)
    trace = read_trace(path, budget=budget)
    assert trace.times.tolist() == [0.0, 1.0]
    assert trace.skipped == {f"lines over {limit:,} bytes (the line limit of {budget})": 1}
    path.write_text("\n".join([*lines[:2], sized(limit + 1, 2.0), sized(limit, 1.0)]))
    assert read_trace(path, budget=budget).times.tolist() == [0.0, 1.0]  # the last, unended


def test_the_report_counts_the_lines_over_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    limit = MemoryBudget(MIN_MEMORY_BUDGET).line_bytes
    over = [sized(limit + 1 + i, 9.0) for i in range(3)]
    other = ["not json"] * 5 + ["[1]"] * 5 + ['{"t": 1}'] * 5  # three commoner reasons
    lines = [HEADER, request(0, 1, 2), request(1, 1, 3), sized(limit, 2.0), *over, *other]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    argv = ["plan", str(path), *PLAN, "--memory-budget", "64MiB", "--output-dir", str(tmp_path)]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert f"3 lines over {limit:,} bytes (the line limit of --memory-budget 64 MiB)" in out
    document = json.loads((tmp_path / "plan.json").read_text())
    assert document["trace"]["requests"] == 3 and sum(document["trace"]["skipped_lines"].values())


@pytest.mark.parametrize(("value", "ok"), [("64MiB", True), (str(64 * MiB - 1), False)])
def test_the_smallest_budget_is_64_mib(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, ok: bool
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(f"{HEADER}\n{request(0, 1, 2)}\n{request(1, 1, 3)}\n")
    argv = ["plan", str(path), *PLAN, "--memory-budget", value, "--output-dir", str(tmp_path)]
    code, _, err = run(capsys, *argv)
    assert (code == 0) == ok, err
    assert ok or "argument --memory-budget: expected 64 MiB to 1 PiB" in err


def test_running_out_of_memory_names_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "lower --exact-limit, or coarsen the trace", whatever ran out."""

    def no_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(analysis, "analyze", no_memory)
    path = tmp_path / "t.jsonl"
    path.write_text(f"{HEADER}\n{request(0, 1, 2)}\n")
    code, _, err = run(capsys, "plan", str(path), *PLAN, "--output-dir", str(tmp_path))
    assert code == 2 and "Traceback" not in err
    error = [line for line in err.splitlines() if line.startswith("kvtier: error:")]
    assert len(error) == 1 and "--exact-limit" not in error[0]
    assert "out of memory: the plan is held within --memory-budget 8 GiB" in error[0]
    assert "lower --memory-budget" in error[0]


@pytest.mark.parametrize("more", [0, 1])
def test_synth_writes_no_line_plan_would_skip(tmp_path: Path, more: int) -> None:
    """The longest line ``kvtier trace synth`` may write is read by ``kvtier plan``."""
    document = LINE_KEYS - 512 - 64 + more  # a RAG prompt of LINE_KEYS (+ more) 1-token chunks
    spec = SynthSpec(
        kind="rag", requests=1, chunk_tokens=1, document=document, documents=1, rate=1e-300
    )  # a time of 300 digits
    problem = size_problem(spec)
    if more:
        assert problem is not None and f"more than the {LINE_KEYS:,}" in problem
        return
    assert problem is None
    path = tmp_path / "rag.jsonl"
    with open(path, "wb") as out:
        write(spec, out)
    assert max(len(line.rstrip(b"\n")) for line in path.open("rb")) <= MemoryBudget().line_bytes
    trace = read_trace(path)
    assert trace.num_chunks == LINE_KEYS and not trace.skipped


@pytest.mark.parametrize("need", [0, 1, 10 * MiB, 3 << 30, 4 << 30, 40 << 30])
def test_the_budget_suggested_for_a_trace_leaves_it_room(need: int) -> None:
    total = MemoryBudget.total_for(need)
    assert MemoryBudget(total).plan_bytes >= need
    assert MemoryBudget(total - 300).plan_bytes < need or need < 300  # the smallest, nearly
