"""``kvtier trace synth`` -> ``kvtier plan`` -> the emitted config, and bad input at the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.cli import main
from kvtier.config import TieringConfig


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_synth_plan_and_emitted_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, config = tmp_path / "mix.jsonl", tmp_path / "kvtier.json"
    assert (
        run(capsys, "trace", "synth", "--kind", "mix", "--requests", "1500", "--out", str(trace))[0]
        == 0
    )
    code, out, err = run(capsys, "plan", str(trace), "--output-dir", str(tmp_path / "out"),
                         "--host-memory", "12GiB", "--process-bytes", "4GiB", "--device-bytes", "1GiB",
                         "--emit-config", str(config))  # fmt: skip
    assert code == 0, err
    assert "verdict: " in out and "--kv-transfer-config" in out
    loaded = TieringConfig.from_json(config.read_text())
    document = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert loaded.cpu_bytes_to_use == document["recommended"]["cpu_bytes_to_use"]
    assert loaded.block_size == document["chunk_tokens"]
    assert (tmp_path / "out" / "plan.png").stat().st_size > 10_000
    flag = out.split("--kv-transfer-config '")[1].split("'")[0]
    assert TieringConfig.from_json(flag).cpu_bytes_to_use == loaded.cpu_bytes_to_use


def test_emitted_config_keeps_a_base_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, base, out_config = tmp_path / "rag.jsonl", tmp_path / "base.json", tmp_path / "new.json"
    run(capsys, "trace", "synth", "--kind", "rag", "--requests", "800", "--out", str(trace))
    base.write_text(json.dumps({"cpu_bytes_to_use": 1 << 30, "metrics_port": 9464,
                                "secondary_tiers": [{"type": "fs", "root_dir": "/data/kv", "fsync": True}]}))  # fmt: skip
    code, _, err = run(capsys, "plan", str(trace), "--output-dir", str(tmp_path), "--no-chart",
                       "--host-memory", "6GiB", "--process-bytes", "4GiB", "--device-bytes", "256MiB",
                       "--config", str(base), "--emit-config", str(out_config))  # fmt: skip
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
def test_bad_traces_are_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      content: bytes, message: str) -> None:  # fmt: skip
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
    row = {"conversations": 24, "throughput_tok_s": 5000.0, "seconds": 10.0,
           "prompt_tokens_from": {"fs": 100_000, "host": 10, "recomputed": 5}}  # fmt: skip
    bench.write_text(json.dumps({
        "capacities": {"chunk_bytes": 65536, "chunk_tokens": 64}, "strategies": ["recompute", "host", "host+fs", "ceiling"],
        "results": [{**row, "strategy": "recompute"}, {**row, "strategy": "host+fs", "seconds": 12.0},
                    {**row, "strategy": "ceiling", "seconds": 11.0}]}))  # fmt: skip
    trace = tmp_path / "c.jsonl"
    run(capsys, "trace", "synth", "--kind", "chat", "--requests", "200", "--out", str(trace))
    code, out, err = run(capsys, "plan", str(trace), "--output-dir", str(tmp_path), "--no-chart",
                         "--calibrate", str(bench))  # fmt: skip
    assert code == 0, err
    assert "prefill 5,000 tokens/s, fs read 0.10 GB/s" in out  # 100k tokens x 1 KiB in 1 s


def test_calibrate_measures_the_fs_tier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "c.jsonl"
    run(capsys, "trace", "synth", "--kind", "chat", "--requests", "200", "--out", str(trace))
    code, out, err = run(capsys, "plan", str(trace), "--output-dir", str(tmp_path), "--no-chart",
                         "--calibrate", "--calibrate-dir", str(tmp_path), "--bytes-per-token", "4096")  # fmt: skip
    assert code == 0, err
    assert "fs tier measured in" in out
