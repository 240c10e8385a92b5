"""``kvtier bench --engine sglang`` without an engine: the strategies' server flags, the pools,
what SGLang asks L3 for, the client against a fake streaming server, the report, and the
command line's usage errors."""

from __future__ import annotations

import http.server
import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from kvtier.bench import sglang_bench, sglang_client, sglang_report
from kvtier.bench.sglang_bench import SglangBenchOptions
from kvtier.bench.sglang_strategies import Pools, asked_from_l3, server_flags
from kvtier.cli.main import main


def extra_config(flags: list[str]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        flags[flags.index("--hicache-storage-backend-extra-config") + 1]
    )
    return loaded


#: A longest conversation of 512 + 2 * 32 + 3 * 4 = 588 tokens.
OPTIONS = SglangBenchOptions(conversations=(2, 8), device_convs=2, host_convs=4,
                             first_prompt_tokens=512, rounds=2, new_tokens=4)  # fmt: skip


def test_pools_are_whole_pages_and_the_ceiling_holds_every_conversation():
    pools = Pools.size(OPTIONS)
    assert pools == Pools(592, 1184, 5920, 2368)


def test_each_strategy_gets_its_pool_and_l3(tmp_path):
    pools = Pools.size(OPTIONS)
    recompute = server_flags("recompute", pools, tmp_path)
    assert recompute[:2] == ["--max-total-tokens", "1184"]
    assert "--enable-hierarchical-cache" not in recompute
    ceiling = server_flags("ceiling", pools, tmp_path)
    assert ceiling[:2] == ["--max-total-tokens", "5920"] and "--hicache-ratio" not in ceiling
    file = server_flags("sglang-file", pools, tmp_path / "f")
    assert file[file.index("--hicache-storage-backend") + 1] == "file"
    assert file[file.index("--hicache-ratio") + 1] == "2.0000"
    assert extra_config(file) == {
        "file_storage_path": str(tmp_path / "f"),
        "prefetch_timeout_base": 10,
    }
    kvtier = server_flags("kvtier-fs", pools, tmp_path / "k")
    config = extra_config(kvtier)
    assert kvtier[kvtier.index("--hicache-storage-backend") + 1] == "dynamic"
    assert config["class_name"] == "KvtierHiCacheStorage" and config["prefetch_timeout_base"] == 10
    assert config["kvtier"] == {
        "secondary_tiers": [{"type": "fs", "root_dir": str(tmp_path / "k")}]
    }


@pytest.mark.parametrize(
    ("prompt", "device", "host", "asked"),
    [
        (893, 0, 0, 880),
        (512, 0, 0, 496),
        (513, 0, 0, 512),
        (900, 640, 0, 256),
        (900, 0, 656, 0),
    ],
)
def test_sglang_asks_l3_for_whole_pages_past_l1_and_l2_and_never_for_a_short_tail(
    prompt, device, host, asked
):
    assert asked_from_l3(prompt, device, host) == asked


class FakeSglang(http.server.BaseHTTPRequestHandler):
    """``/generate`` streamed as SGLang streams it: cumulative ``output_ids``, the prompt's
    last ids echoed as the answer; every prompt's whole pages "from storage"."""

    prompts: ClassVar[list[list[int]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt, count = body["input_ids"], body["sampling_params"]["max_new_tokens"]
        FakeSglang.prompts.append(prompt)
        self.send_response(200)
        self.end_headers()
        cached = {"device": 0, "host": 0, "storage": (len(prompt) - 1) // 16 * 16}
        for i in range(1, count + 1):
            chunk = {"output_ids": prompt[-i:], "meta_info": {"completion_tokens": i,
                     "cached_tokens_details": cached}}  # fmt: skip
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_server():
    FakeSglang.prompts = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeSglang)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield SimpleNamespace(port=httpd.server_address[1], process=SimpleNamespace(pid=os.getpid()))
    httpd.shutdown()


PHASE = {"round": 0, "conversations": 3, "first_prompt_tokens": 300, "rounds": 2,
         "user_turn_tokens": 8, "new_tokens": 3, "vocab_size": 1000, "seed": 5,
         "one_shots": 0, "one_shot_tokens": 16}  # fmt: skip


def test_a_phase_serves_every_turn_after_its_conversations_previous_answer(fake_server):
    report = sglang_client.run_phase(fake_server, PHASE, 2)
    requests = {r["key"]: r for r in report["requests"]}
    assert len(requests) == 9 and report["seconds"] > 0 and report["cpu_seconds"] >= 0
    first = FakeSglang.prompts[[len(p) for p in FakeSglang.prompts].index(300)]
    second = next(p for p in FakeSglang.prompts if len(p) == 311 and p[:300] == first)
    assert second[300:303] == first[-3:]  # turn 1 carries turn 0's answer
    assert all(len(r["tokens"]) == 3 and len(r["itl_s"]) == 2 for r in requests.values())
    assert requests["0/0"]["cached"] == {"device": 0, "host": 0, "storage": 288}
    assert sorted(len(p) for p in report["finals"]) == [322, 322, 322]


def test_the_replay_counts_what_l3_served_of_what_sglang_asked_for(fake_server):
    replay = sglang_client.replay(fake_server, [[1] * 300, [2] * 100])
    assert replay == {"prompts": 2, "asked_tokens": 288, "served_tokens": 288 + 96,
                      "hit_ratio": round(384 / 288, 4)}  # fmt: skip


def phase(turn: int, n: int, seconds: float, storage: int) -> dict[str, Any]:
    request = {"key": "0/0", "one_shot": False, "prompt_tokens": 900, "tokens": [1] * 4,
               "ttft_s": seconds / 10, "itl_s": [0.01],
               "cached": {"device": 0, "host": 100, "storage": storage}}  # fmt: skip
    return {"round": turn, "conversations": n, "seconds": seconds, "cpu_seconds": 1.0,
            "requests": [request], "finals": [[1] * 900]}  # fmt: skip


def reports(rounds: int) -> dict[str, dict[str, Any]]:
    def report(seconds: float, storage: int, replay: Any = None) -> dict[str, Any]:
        out = {"phases": [phase(r, n, seconds * (1 + r / 20), storage) for r in range(rounds)
                          for n in (2, 8)],
               "disk_bytes": {}, "load_seconds": 30.0, "load_average_1m": 1.5}  # fmt: skip
        return out | ({"l3_replay": replay} if replay else {})

    replay = {"prompts": 8, "asked_tokens": 1000, "served_tokens": 990, "hit_ratio": 0.99}
    return {"recompute": report(3.0, 0), "sglang-file": report(2.5, 700, replay),
            "kvtier-fs": report(2.0, 800, replay), "ceiling": report(1.0, 0)}  # fmt: skip


def test_the_report_compares_kvtier_with_sglangs_file_backend(tmp_path):
    runs = reports(6)  # 6 rounds: the fewest with a 95 % interval
    table = sglang_report.rows(runs)
    options = SimpleNamespace(conversations=(2, 8), repeats=6)
    pools = Pools(592, 1184, 5920, 2368)
    doc = sglang_report.to_json(options, pools, runs, table)
    kvtier = next(r for r in table if r["strategy"] == "kvtier-fs")
    assert kvtier["prompt_tokens_from"] == {"device": 0, "host": 100, "storage": 800, "computed": 0}
    assert kvtier["fraction_of_ceiling"] == 0.5 and kvtier["answers_equal_to_recompute"] == 1
    assert [r["throughput_ratio"] for r in doc["kvtier_fs_vs_sglang_file"]][:2] == [1.25, 1.25]
    assert doc["kvtier_fs_vs_sglang_file_verdict"][0]["verdict"] == "ahead"
    lines = sglang_report.ratio_lines(doc)
    assert "round 1 N=2: kvtier-fs / sglang-file throughput 1.25x, TTFT p99 0.80x" in lines
    assert any(line.startswith("kvtier-fs / sglang-file over rounds") for line in lines)
    assert lines[-1] == ("kvtier-fs L3 replay after a flush: 990 of the 1000 prompt tokens "
                         "SGLang asked L3 for were served (99.0%), 8 prompts")  # fmt: skip
    assert "storage" in sglang_report.format_table(table).splitlines()[0]
    chart = tmp_path / "chart.png"
    sglang_report.write_chart(table, "t", chart, doc["kvtier_fs_vs_sglang_file_verdict"])
    assert chart.stat().st_size > 0
    json.dumps(doc)


def run_cli(argv: list[str], tmp_path: Path, capsys: Any) -> tuple[Any, str]:
    try:
        code = main(
            ["bench", "--engine", "sglang", "--quick", "--output-dir", str(tmp_path), *argv]
        )
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def test_a_missing_sglang_venv_names_make_sglang_env(tmp_path, capsys):
    code, err = run_cli(["--sglang-python", str(tmp_path / "nope")], tmp_path, capsys)
    assert code == 2 and "argument --sglang-python: no python at" in err
    assert "make sglang-env" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--strategies", "vllm-fs,kvtier-fs"],
            "argument --strategies: vllm-fs not with --engine sglang",
        ),
        (
            ["--device-convs", "4", "--host-convs", "4"],
            "--host-convs must be larger than --device-convs",
        ),
        (["--model", "/nonexistent"], "argument --model: expected a model directory"),
    ],
)
def test_bad_sglang_options_are_usage_errors(tmp_path, capsys, argv, message):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    argv = ["--sglang-python", str(python), "--model", str(model), *argv]
    code, err = run_cli(argv, tmp_path, capsys)
    assert code == 2 and message in err and "Traceback" not in err, err


@pytest.mark.parametrize("strategy", ["kvtier-fs", "sglang-file", "recompute"])
def test_each_phase_settles_the_l3_writes_with_sglangs_own_quiet_time(
    strategy, fake_server, tmp_path, monkeypatch
):
    """SGLang backs up to L3 in batches, so a phase's trailing writes are waited for with the
    bench's 3 s of quiet (``SETTLE_S``), not ``settle_writes``' default 0.25 s, after the
    phase's clock stopped; a strategy without L3 only syncs."""
    calls = []
    monkeypatch.setattr(
        sglang_bench, "settle_writes", lambda dirs, *limits: calls.append((dirs, limits)) or 0.5
    )
    server = SimpleNamespace(**vars(fake_server), workdir=tmp_path, flush=lambda: None)
    engine = sglang_bench.Engine(server, strategy, [PHASE], 2)
    engine.ask("0", "DONE")
    assert engine.done[0]["settle_seconds"] == 0.5 and engine.done[0]["seconds"] > 0
    wanted = [str(tmp_path / f"l3-{strategy}")] if strategy != "recompute" else []
    assert calls == [(wanted, (sglang_bench.SETTLE_S, sglang_bench.SETTLE_PHASE_LIMIT_S))]
