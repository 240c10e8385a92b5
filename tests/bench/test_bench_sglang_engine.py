"""``kvtier bench --engine sglang`` end to end on real SGLang servers (two starts, ~2-3 min):
a tiny workload with sglang-file and kvtier-fs, the table, JSON and chart written, and the
replay after a flush served from L3. Needs the SGLang test venv (built on first use like the
other SGLang engine tests; ``KVTIER_SKIP_SGLANG=1`` skips it)."""

from __future__ import annotations

import json
import os

import pytest

from kvtier.cli.main import main

pytestmark = pytest.mark.timeout(900)


def test_the_sglang_bench_runs_and_l3_serves_the_replay(tmp_path, capsys):
    if os.environ.get("KVTIER_SKIP_SGLANG") == "1":
        pytest.skip("KVTIER_SKIP_SGLANG=1: SGLang tests skipped on request")
    from tests.integrations.sglang.engine import SglangEnv

    env = SglangEnv.build()
    code = main([
        "bench", "--engine", "sglang", "--quick", "--sglang-python", str(env.python),
        "--model", str(env.model), "--strategies", "sglang-file,kvtier-fs",
        "--conversations", "2", "--rounds", "1", "--output-dir", str(tmp_path),
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    document = json.loads((tmp_path / "bench-sglang.json").read_text())
    assert (tmp_path / "bench-sglang.png").stat().st_size > 0
    assert [r["strategy"] for r in document["results"]] == ["sglang-file", "kvtier-fs"]
    assert all(r["requests"] == 4 for r in document["results"])
    assert len(document["kvtier_fs_vs_sglang_file"]) == 1
    for strategy, replay in document["l3_replay"].items():
        assert replay["asked_tokens"] > 0 and replay["hit_ratio"] >= 0.95, (strategy, replay)
    assert "kvtier-fs L3 replay after a flush" in out
