"""``kvtier bench`` on bad options (issue 11, item 12): an argparse-style usage error (exit
status 2, ``kvtier: error: ...``) before any sweep starts, never a traceback.

Every command line starts from a tiny, one-conversation run, so that an option wrongly accepted
costs seconds, not the default run's minutes.
"""

from __future__ import annotations

import socket
import sys

import pytest

from kvtier.cli.main import main

TINY = [
    "bench",
    "--quick",
    "--model",
    "tiny",
    "--conversations",
    "1",
    "--rounds",
    "1",
    "--first-prompt-tokens",
    "16",
    "--no-progress",
]


def bench(argv, tmp_path, capsys):
    """``main`` on a tiny bench plus ``argv``: (exit status, stderr)."""
    try:
        code = main([*TINY, "--output-dir", str(tmp_path / "out"), *argv])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def assert_usage_error(code, err, message):
    assert code == 2
    assert "usage: kvtier" in err and f"kvtier: error: {message}" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--rounds", "0"], ["--rounds", "-1"], ["--first-prompt-tokens", "0"],
        ["--first-prompt-tokens", "99999999999999999999"], ["--user-turn-tokens", "-3"],
        ["--new-tokens", "0"], ["--block-size", "0"], ["--blocks-per-chunk", "1e30"],
        ["--threads", "0"], ["--threads", "100000"], ["--seed", "-1"],
        ["--device-convs", "0"], ["--device-convs", "nan"], ["--host-convs", "inf"],
        ["--host-convs", "-1"], ["--host-convs", "1e300"], ["--conversations", "0"],
        ["--conversations", "1,99999999"], ["--metrics-port", "70000"],
        ["--metrics-port", "-1"],
    ],
)  # fmt: skip
def test_zero_negative_and_absurd_numbers_are_usage_errors(tmp_path, capsys, argv):
    code, err = bench(argv, tmp_path, capsys)
    assert_usage_error(code, err, f"argument {argv[0]}:")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--first-prompt-tokens", "20000"], "a conversation grows to"),
        (["--block-size", "64", "--blocks-per-chunk", "64"], "a chunk of 4096 tokens is longer"),
        (["--model", "no/such/model"], "argument --model: expected tiny, small, base or a model"),
        (["--host-convs", "0.0001"], "argument --host-convs: host memory of 0 bytes holds no"),
    ],
)
def test_impossible_workloads_are_usage_errors(tmp_path, capsys, argv, message):
    code, err = bench(argv, tmp_path, capsys)
    assert_usage_error(code, err, message)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file or directory"),
        (b"\xff\xfe\x00binary", "not UTF-8 text"),
        (b"{not json", "not valid JSON"),
        (b'{"cpu_bytes_to_use": 4096, "metrics_port": 70000}', "metrics_port: expected a TCP"),
    ],
)
def test_a_missing_or_broken_config_is_a_usage_error(tmp_path, capsys, content, message):
    path = tmp_path / "tiers.json"
    if content is not None:
        path.write_bytes(content)
    code, err = bench(["--config", str(path)], tmp_path, capsys)
    assert_usage_error(code, err, "argument --config: ")
    assert message in err


@pytest.mark.parametrize("flag", ["--output-dir", "--json", "--chart"])
def test_an_unwritable_output_is_a_usage_error(tmp_path, capsys, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # nothing can be created under a regular file, not even by root
    target = blocker / ("out" if flag == "--output-dir" else "result")
    code, err = bench([flag, str(target)], tmp_path, capsys)
    assert_usage_error(code, err, f"argument {flag}: cannot write in {blocker}")


def test_a_metrics_port_in_use_is_a_usage_error(tmp_path, capsys):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, err = bench(["--metrics-port", str(port)], tmp_path, capsys)
    assert_usage_error(code, err, f"argument --metrics-port: cannot listen on 127.0.0.1:{port}")


def test_the_vllm_bench_turns_the_order_of_strategies_at_each_n():
    from kvtier.bench.engine_bench import phase_order, rotated

    names = ["vllm-fs", "kvtier-fs", "ceiling"]
    orders = [phase_order(names, n_index, 0) for n_index in range(3)]
    assert [order[0] for order in orders] == names  # each strategy runs first once
    assert all(sorted(order) == sorted(names) for order in orders)
    assert rotated(names, 3) == names and rotated([], 5) == []


@pytest.mark.parametrize(
    "names", [["vllm-fs", "kvtier-fs"], ["a", "vllm-fs", "kvtier-fs", "b", "c"]]
)
@pytest.mark.parametrize("num_n", [1, 2, 3, 5])
def test_at_each_n_two_strategies_swap_places_from_round_to_round(names, num_n):
    """Turning the order by the phase's index put vllm-fs before kvtier-fs in 4 phases of 5,
    and at the same N in every round when the number of Ns was a multiple of the strategies'."""
    from kvtier.bench.engine_bench import phase_order

    for n_index in range(num_n):
        first = [
            phase_order(names, n_index, r).index("kvtier-fs")
            < phase_order(names, n_index, r).index("vllm-fs")
            for r in range(6)
        ]
        assert first == [first[0], not first[0]] * 3


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_missing_chart_package_stops_an_engine_bench_before_it_starts(
    engine, tmp_path, capsys, monkeypatch
):
    """The chart is drawn after a run of minutes: without matplotlib the bench says so first
    (a 20-round vLLM run once ended in this error, its chart lost), even when the engine's venv
    is missing too (as on a fresh machine, before the engine tests have built it)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setenv(f"KVTIER_{engine.upper()}_PYTHON", str(tmp_path / "no-venv" / "python"))
    try:
        code = main(["bench", "--engine", engine, "--quick", "--output-dir", str(tmp_path)])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code not in (0, None)
    assert "needs matplotlib" in err and "[bench]" in err
    assert not (tmp_path / f"bench-{engine}.json").exists()


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--repeat", "5"], "--repeat"), (["--concurrency", "4"], "--concurrency"),
        (["--mix"], "--mix"), (["--strategies", "kvtier-fs,vllm-fs"], "--strategies"),
        (["--vllm-python", "/usr/bin/python3"], "--vllm-python"),
    ],
)  # fmt: skip
def test_an_engine_bench_flag_is_refused_without_its_engine(tmp_path, capsys, argv, flag):
    """``--repeat 5`` ran one transformers sweep and gave no verdict, silently."""
    code, err = bench(argv, tmp_path, capsys)
    assert_usage_error(code, err, f"argument {flag}: not with --engine transformers")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--admission"], "--admission"), (["--threads", "2"], "--threads"),
        (["--metrics-port", "0"], "--metrics-port"), (["--no-prefetch"], "--no-prefetch"),
        (["--block-size", "32"], "--block-size"), (["--config", "x.json"], "--config"),
    ],
)  # fmt: skip
def test_a_transformers_flag_is_refused_with_an_engine_bench(tmp_path, capsys, engine, argv, flag):
    code, err = bench(["--engine", engine, *argv], tmp_path, capsys)
    assert_usage_error(code, err, f"argument {flag}: not with --engine {engine}")


def test_each_engine_refuses_the_other_engines_python(tmp_path, capsys):
    code, err = bench(["--engine", "vllm", "--sglang-python", "/x"], tmp_path, capsys)
    assert_usage_error(code, err, "argument --sglang-python: not with --engine vllm")
