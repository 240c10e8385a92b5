"""``kvtier trace from-events`` within bounds (issue 25, finding 4): memory within
``--memory-budget``, output within ``--max-output-bytes``, non-regular captures refused at once,
one error line per bad input, and no line ``kvtier plan`` would skip.

Memory is measured as the peak RSS of a child process, with wide margins; nothing is timed.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvtier.cli.main import main
from kvtier.plan import trace_from_events
from kvtier.plan.budget import MemoryBudget
from kvtier.plan.cost import PlanInputError
from kvtier.plan.trace import request_line
from kvtier.plan.trace_from_events import Converter, TraceOutput, convert
from kvtier.plan.trace_read import read_trace
from tests.child_process import child_env
from tests.plan.helpers import peak_rss

msgpack = pytest.importorskip("msgpack")

MiB = 1 << 20
CLI = [sys.executable, "-m", "kvtier.cli", "trace", "from-events"]


def stored(hashes: list[int], parent: int | None) -> list[Any]:
    return ["BlockStored", hashes, parent, [], 16, None, "GPU"]


def capture(path: Path, *batches: Any) -> Path:
    path.write_bytes(b"".join(msgpack.packb(b) for b in batches))
    return path


def exploding(path: Path, chain: int = 10_000, stores: int = 10_000) -> Path:
    """The issue's capture (0.39 MiB at the defaults): a chain, then stores that each extend
    its end too late to merge, so every request repeats the whole chain (1.9 GB of trace)."""
    first = [0.0, [stored(list(range(1, chain + 1)), None)]]
    rest = ([10.0 + 2 * i, [stored([chain + 1 + i], chain)]] for i in range(stores))
    return capture(path, first, *rest)


def cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *argv], capture_output=True, text=True, timeout=timeout, env=child_env()
    )


def one_error(result: subprocess.CompletedProcess[str]) -> str:
    """The one ``kvtier: error:`` line of a failed command (exit status 1 or 2, no traceback)."""
    assert result.returncode in (1, 2) and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("kvtier: error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_an_exploding_capture_stays_within_memory_and_output(tmp_path: Path) -> None:
    """Before: 832 MiB of memory and a 1.9 GB trace from this 0.39 MiB capture."""
    path, out = exploding(tmp_path / "cap.msgpack"), tmp_path / "t.jsonl"
    assert path.stat().st_size < 0.4 * MiB
    limits = ["--memory-budget", "64MiB", "--max-output-bytes", "32MiB"]
    code, peak, err = peak_rss([*CLI, str(path), "--out", str(out), *limits])
    assert code == 2 and "Traceback" not in err, err
    assert "larger than --max-output-bytes 32 MiB (33,554,432 bytes)" in err
    assert peak < 64 * MiB + 150 * MiB, f"peak RSS {peak / MiB:.0f} MiB"
    assert list(tmp_path.iterdir()) == [path]  # no trace, no temporary file


@pytest.mark.parametrize("short", [0, 1])
def test_the_output_budget_holds_exactly(tmp_path: Path, short: int) -> None:
    path = exploding(tmp_path / "cap.msgpack", chain=50, stores=40)
    whole = io.StringIO()
    convert(path.open("rb"), whole, "GPU", 1.0)
    size = len(whole.getvalue())
    out = tmp_path / "t.jsonl"
    result = cli(str(path), "--out", str(out), "--max-output-bytes", str(size - short))
    if short:
        error = one_error(result)
        assert "the trace would be larger than --max-output-bytes" in error
        assert f"({size - 1:,} bytes) after 40 requests" in error
        assert not out.exists()
    else:
        assert result.returncode == 0, result.stderr
        assert out.read_text() == whole.getvalue()


def test_no_line_is_written_that_plan_would_skip(tmp_path: Path) -> None:
    """Before: a request of 900,000 chunks became a 17 MiB line, which plan skips."""
    limit = MemoryBudget().line_bytes
    path = capture(
        tmp_path / "cap.msgpack",
        [0.0, [stored(list(range(1, 900_001)), None)]],  # a chain of 900,000 blocks
        [5.0, [stored([900_001], 900_000)]],  # extends it: also too long
        [9.0, [stored([7_000_001, 7_000_002], None)]],
    )
    out = tmp_path / "t.jsonl"
    result = cli(str(path), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert f"2 requests over {limit:,} bytes" in result.stdout
    with out.open("rb") as trace:
        assert max(len(line.rstrip(b"\n")) for line in trace) <= limit
    read = read_trace(out)
    assert read.num_requests == 1 and not read.skipped


@pytest.mark.parametrize("spare", [0, 1])
def test_a_line_at_the_limit_is_written_one_byte_over_is_not(spare: int) -> None:
    from array import array

    keys = array("Q", [1, 2, 3])
    line = request_line(4.0, 48, [1, 2, 3])
    file = io.StringIO()
    output = TraceOutput(file, line_bytes=len(line) - 1 - 1 + spare, max_bytes=1 << 20)
    assert output.request(4.0, keys, 16) == bool(spare)
    assert file.getvalue().endswith(line) == bool(spare)


@pytest.mark.parametrize("more", [0, 1])
def test_parent_links_are_kept_up_to_the_budget(more: int) -> None:
    budget = MemoryBudget(100 * 4 * 256)  # 100 links
    assert budget.parent_links == 100
    converter = Converter(TraceOutput(io.StringIO(), budget.line_bytes, 1 << 20), budget)
    for key in range(100 + more):
        converter.batch([float(key), [stored([key + 1], None)]])
    assert converter.forgotten == (51 if more else 0)
    assert len(converter._parent) == (50 if more else 100)


def test_forgetting_links_keeps_the_prefixes_recent_stores_share() -> None:
    budget = MemoryBudget(100 * 4 * 256)  # 100 links
    file = io.StringIO()
    converter = Converter(TraceOutput(file, budget.line_bytes, 1 << 20), budget)
    converter.batch([0.0, [stored([1, 2], None)]])  # a shared prefix, stored first
    for i in range(1000):  # then 1,000 requests on it, each 2 s apart: 10 times the links
        converter.batch([2.0 * (i + 1), [stored([10 + i], 2)]])
    converter.finish()
    assert converter.forgotten > 900 and len(converter._parent) <= 100
    last = json.loads(file.getvalue().splitlines()[-1])
    assert last["chunks"] == [f"{1:016x}", f"{2:016x}", f"{1009:016x}"]


@pytest.mark.parametrize("ts", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_a_bad_timestamp_is_one_error_line(tmp_path: Path, ts: float) -> None:
    """Before: a timestamp of infinity raised ValueError out of the writer (a traceback); NaN
    and negative times were skipped already."""
    path = capture(tmp_path / "cap.msgpack", [ts, [stored([1, 2], None)]])
    error = one_error(cli(str(path), "--out", str(tmp_path / "t.jsonl")))
    assert "1 batches without a finite ts >= 0" in error
    good = capture(tmp_path / "good.msgpack", [ts, [stored([1], None)]], [1.0, [stored([2], 1)]])
    result = cli(str(good), "--out", str(tmp_path / "t.jsonl"))
    assert result.returncode == 0 and "batches without a finite ts >= 0" in result.stdout


@pytest.mark.parametrize(
    "data",
    [b"\x92\x01\x91\x81\x91\x01\x02", b"\x91" * 5000, b"\x92\x01\x91\xa2\xff\xfe"],
    ids=["list-as-map-key", "nested", "bad-utf8"],
)
def test_undecodable_captures_are_one_error_line(tmp_path: Path, data: bytes) -> None:
    """Before: a map keyed by a list raised TypeError (a traceback)."""
    path = tmp_path / "cap.msgpack"
    path.write_bytes(data)
    error = one_error(cli(str(path), "--out", str(tmp_path / "t.jsonl")))
    assert "undecodable bytes at the end" in error or "batches that do not decode" in error


def test_a_batch_over_the_budget_ends_the_reading_counted(tmp_path: Path) -> None:
    budget = MemoryBudget(64 * MiB)  # batches of up to 64 KiB
    small = [1.0, [stored([1, 2], None)]]
    big = [2.0, [stored(list(range(1000, 41_000)), 2)]]  # 40,000 hashes: 120 KiB
    path = capture(tmp_path / "cap.msgpack", small, big, [3.0, [stored([3], 2)]])
    out = io.StringIO()
    converter = convert(path.open("rb"), out, "GPU", 1.0, budget)
    assert converter.output.requests == 1
    assert list(converter.skipped) == [
        f"batches over {budget.event_batch_bytes:,} bytes (the limit of {budget}): read up to "
        "the first"
    ]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_a_capture_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """As ``kvtier plan`` refuses its trace (this already held before issue 25's change)."""
    target = {"fifo": tmp_path / "fifo", "dev-zero": Path("/dev/zero"), "directory": tmp_path}
    if kind == "fifo":
        os.mkfifo(target["fifo"])
    result = cli(str(target[kind]), "--out", str(tmp_path / "t.jsonl"), timeout=60)
    assert f"capture {target[kind]}: not a regular file" in one_error(result)


def test_running_out_of_memory_names_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "lower --exact-limit, or coarsen the trace", an option from-events lacks."""

    def no_memory(self: Converter, value: Any) -> None:
        raise MemoryError

    monkeypatch.setattr(trace_from_events.Converter, "batch", no_memory)
    path = capture(tmp_path / "cap.msgpack", [1.0, [stored([1], None)]])
    with pytest.raises(SystemExit) as exit:
        main(["trace", "from-events", str(path), "--out", str(tmp_path / "t.jsonl")])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "--exact-limit" not in err
    assert "out of memory: the conversion is held within --memory-budget 8 GiB" in err


def test_a_capture_with_every_request_too_long_is_refused_clearly() -> None:
    budget = MemoryBudget(64 * MiB)
    data = msgpack.packb([1.0, [stored(list(range(1, budget.line_keys + 2)), None)]])
    with pytest.raises(PlanInputError, match="no request of the capture could be written"):
        convert(io.BytesIO(data), io.StringIO(), "GPU", 1.0, budget)


def test_converted_lines_read_back_as_written(tmp_path: Path) -> None:
    path = exploding(tmp_path / "cap.msgpack", chain=3, stores=2)
    out = tmp_path / "t.jsonl"
    assert cli(str(path), "--out", str(out)).returncode == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    chains = [[int(c, 16) for c in line["chunks"]] for line in lines[1:]]
    assert chains == [[1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 5]]
