"""``kvtier trace synth`` -> ``kvtier plan`` -> the emitted config, and bad input at the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvtier.cli.main import main
from kvtier.config import TieringConfig
from kvtier.integrations.vllm import check
from kvtier.integrations.vllm.engine_config import engine_config
from tests.cli_run import run

MODULE = "kvtier.integrations.vllm"


def test_synth_plan_and_emitted_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(check, "installed_target", lambda: ("vllm-cuda", "vllm 0.33.0 is here"))
    trace, config = tmp_path / "mix.jsonl", tmp_path / "kvtier.json"
    assert (
        run(capsys, "trace", "synth", "--kind", "mix", "--requests", "1500", "--out", str(trace))[0]
        == 0
    )
    code, out, err = run(
        capsys,
        "plan",
        str(trace),
        "--output-dir",
        str(tmp_path / "out"),
        "--host-memory",
        "12GiB",
        "--process-bytes",
        "4GiB",
        "--device-bytes",
        "1GiB",
        "--emit-config",
        str(config),
    )
    assert code == 0, err
    assert "verdict: " in out and "--kv-transfer-config" in out
    loaded = TieringConfig.from_json(config.read_text())
    document = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert loaded.cpu_bytes_to_use == document["recommended"]["cpu_bytes_to_use"]
    assert loaded.block_size == document["chunk_tokens"]
    assert (tmp_path / "out" / "plan.png").stat().st_size > 10_000
    flag = json.loads(out.split("--kv-transfer-config '")[1].split("'")[0])
    extra = flag["kv_connector_extra_config"]
    assert extra["cpu_bytes_to_use"] == loaded.cpu_bytes_to_use
    assert_starts(tmp_path, capsys, flag, "vllm-cuda")  # the installed build's
    assert extra["spec_name"] == "TieringOffloadingSpec"
    if document["recommended"]["admission"]:
        assert [a.min_reuse for a in loaded.admission] == [2]


def assert_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: dict[str, Any], target: str
) -> None:
    """``flag`` passes ``kvtier config check`` for ``target`` and kvtier's engine runtime, and
    its tiers are kvtier's (vLLM's own ``fs`` takes no ``max_bytes``)."""
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(flag))
    code, out, err = run(capsys, "config", "check", str(path), "--target", target)
    assert code == 0 and f"vLLM target:     {target}" in out, err
    extra = flag["kv_connector_extra_config"]
    engine_config(extra)
    for tier in extra.get("secondary_tiers", []):
        assert tier["type"].startswith("Kvtier") and tier["module_path"] == MODULE


def test_emitted_config_keeps_a_base_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, base, out_config = tmp_path / "rag.jsonl", tmp_path / "base.json", tmp_path / "new.json"
    run(capsys, "trace", "synth", "--kind", "rag", "--requests", "800", "--out", str(trace))
    base.write_text(
        json.dumps(
            {
                "cpu_bytes_to_use": 1 << 30,
                "metrics_port": 9464,
                "secondary_tiers": [{"type": "fs", "root_dir": "/data/kv", "fsync": True}],
            }
        )
    )
    code, _, err = run(
        capsys,
        "plan",
        str(trace),
        "--output-dir",
        str(tmp_path),
        "--no-chart",
        "--host-memory",
        "6GiB",
        "--process-bytes",
        "4GiB",
        "--device-bytes",
        "256MiB",
        "--config",
        str(base),
        "--emit-config",
        str(out_config),
    )
    assert code == 0, err
    emitted = json.loads(out_config.read_text())
    assert emitted["metrics_port"] == 9464
    fs = [t for t in emitted["secondary_tiers"] if t["type"] == "fs"]
    assert not fs or (fs[0]["root_dir"] == "/data/kv" and fs[0]["fsync"] is True)
    TieringConfig.from_json(out_config.read_text())


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "the file is empty"),
        (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 50, "no requests"),
        (b'{"t": NaN, "tokens": [1, 2]}\n' * 3, "3 lines skipped"),
        (b'{"kvtier_trace": 9}\n', "version 9"),
    ],
)
def test_bad_traces_are_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    code, _, err = run(capsys, "plan", str(path), "--output-dir", str(tmp_path))
    assert code == 2
    assert message in err and "Traceback" not in err


def test_bad_options_are_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "u.jsonl"
    run(capsys, "trace", "synth", "--kind", "unique", "--requests", "50", "--out", str(trace))
    for argv, message in (
        (["--device-bytes", "lots"], "expected bytes"),
        (["--chunk-tokens", "100"], "--chunk-tokens 100"),
        (["--calibrate", str(tmp_path / "nope.json")], "bench JSON"),
        (["--config", str(trace)], "configuration"),
    ):
        code, _, err = run(capsys, "plan", str(trace), "--output-dir", str(tmp_path), *argv)
        assert code == 2 and message in err and "Traceback" not in err, (argv, err)


def test_unique_prompts_at_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "u.jsonl"
    run(capsys, "trace", "synth", "--kind", "unique", "--requests", "500", "--out", str(trace))
    code, out, _ = run(capsys, "plan", str(trace), "--output-dir", str(tmp_path), "--no-chart")
    assert code == 0
    assert "verdict: don't tier" in out and "100% of prompts are unique: no tier can help" in out


def test_calibrate_from_a_bench_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "bench.json"
    row = {
        "conversations": 24,
        "throughput_tok_s": 5000.0,
        "seconds": 10.0,
        "prompt_tokens_from": {"fs": 100_000, "host": 10, "recomputed": 5},
    }
    bench.write_text(
        json.dumps(
            {
                "capacities": {"chunk_bytes": 65536, "chunk_tokens": 64},
                "strategies": ["recompute", "host", "host+fs", "ceiling"],
                "results": [
                    {**row, "strategy": "recompute"},
                    {**row, "strategy": "host+fs", "seconds": 12.0},
                    {**row, "strategy": "ceiling", "seconds": 11.0},
                ],
            }
        )
    )
    trace = tmp_path / "c.jsonl"
    run(capsys, "trace", "synth", "--kind", "chat", "--requests", "200", "--out", str(trace))
    code, out, err = run(
        capsys,
        "plan",
        str(trace),
        "--output-dir",
        str(tmp_path),
        "--no-chart",
        "--calibrate",
        str(bench),
    )
    assert code == 0, err
    assert "prefill 5,000 tokens/s, fs read 0.10 GB/s" in out  # 100k tokens x 1 KiB in 1 s


def test_calibrate_measures_the_fs_tier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "c.jsonl"
    run(capsys, "trace", "synth", "--kind", "chat", "--requests", "200", "--out", str(trace))
    code, out, err = run(
        capsys,
        "plan",
        str(trace),
        "--output-dir",
        str(tmp_path),
        "--no-chart",
        "--calibrate",
        "--calibrate-dir",
        str(tmp_path),
        "--bytes-per-token",
        "4096",
    )
    assert code == 0, err
    assert "fs tier measured in" in out


@pytest.fixture(scope="module")
def mix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    trace = tmp_path_factory.mktemp("mix") / "mix.jsonl"
    assert main(["trace", "synth", "--kind", "mix", "--requests", "1500", "--out", str(trace)]) == 0
    return trace


def plan_line(
    capsys: pytest.CaptureFixture[str], trace: Path, out: Path, *argv: str
) -> tuple[str, dict[str, Any]]:
    code, text, err = run(
        capsys,
        "plan",
        str(trace),
        "--output-dir",
        str(out),
        "--no-chart",
        "--device-bytes",
        "1GiB",
        "--emit-vllm",
        str(out / "vllm.json"),
        *argv,
    )
    assert code == 0, err
    flag = json.loads(text.split("--kv-transfer-config '")[1].split("'")[0])
    assert flag == json.loads((out / "vllm.json").read_text())
    return text, flag


@pytest.mark.parametrize(
    ("target", "spec", "block"),
    [("vllm-cpu", "CPUTieringOffloadingSpec", 128), ("vllm-cuda", "TieringOffloadingSpec", 16)],
)
def test_the_vllm_line_starts_its_target(tmp_path, capsys, mix, target, spec, block):
    text, flag = plan_line(
        capsys,
        mix,
        tmp_path,
        "--target",
        target,
        "--host-memory",
        "12GiB",
        "--process-bytes",
        "10GiB",
        "--page-cache-bytes",
        "0",
        "--fs-root",
        "/kv",
    )
    assert f"vLLM target:   {target} (--target)" in text
    extra = flag["kv_connector_extra_config"]
    assert extra["spec_name"] == spec and extra["block_size"] % block == 0
    assert_starts(tmp_path, capsys, flag, target)
    assert (
        extra["secondary_tiers"][0]["root_dir"] == "/kv"
        and "max_bytes" in extra["secondary_tiers"][0]
    )
    other = "vllm-cuda" if target == "vllm-cpu" else "vllm-cpu"
    code, _, err = run(capsys, "config", "check", str(tmp_path / "vllm.json"), "--target", other)
    assert code == 2 and "spec_name" in err


def test_the_default_target_is_the_installed_vllm(tmp_path, capsys, mix, monkeypatch):
    monkeypatch.setattr(check, "installed_target", lambda: ("vllm-cpu", "vllm-cpu 0.32.0 is here"))
    text, flag = plan_line(capsys, mix, tmp_path)
    assert "vLLM target:   vllm-cpu (vllm-cpu 0.32.0 is here)" in text
    assert flag["kv_connector_extra_config"]["spec_name"] == "CPUTieringOffloadingSpec"


def test_host_memory_is_capped_at_half_of_this_machine(tmp_path, capsys, mix, monkeypatch):
    import kvtier.config.checks

    monkeypatch.setattr(kvtier.config.checks, "physical_memory_bytes", lambda: 4 << 30)
    text, flag = plan_line(capsys, mix, tmp_path, "--host-memory", "64GiB")
    assert flag["kv_connector_extra_config"]["cpu_bytes_to_use"] <= 2 << 30
    assert "cpu_bytes_to_use capped at" in text and "half of this machine's 4.0 GiB" in text
    text, flag = plan_line(
        capsys, mix, tmp_path, "--host-memory", "64GiB", "--max-cpu-bytes", "1GiB"
    )
    assert flag["kv_connector_extra_config"]["cpu_bytes_to_use"] <= 1 << 30
    assert "(--max-cpu-bytes)" in text
    monkeypatch.setattr(kvtier.config.checks, "physical_memory_bytes", lambda: 1 << 40)
    text, flag = plan_line(capsys, mix, tmp_path, "--host-memory", "64GiB")
    assert (
        "cpu_bytes_to_use capped" not in text
        and flag["kv_connector_extra_config"]["cpu_bytes_to_use"] > 8 << 30
    )
