"""``kvtier bench --engine vllm --repeat K`` without an engine: the flag, the rounds' phases and
order, and the report's per-round ratios and verdict on synthetic runner reports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import ClassVar

import pytest

from kvtier.bench import pair_verdict, vllm_bench, vllm_cli, vllm_report
from kvtier.bench.phase import ROUND_SEED_STEP
from kvtier.bench.vllm_bench import VllmBench, VllmBenchOptions
from kvtier.bench.vllm_runner import tree_cpu_seconds
from kvtier.bench.vllm_strategies import Pools


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    for name in vllm_cli.SHARED:
        parser.add_argument("--" + name.replace("_", "-"))
    vllm_cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_repeat_reaches_the_options_and_defaults_to_one():
    assert vllm_cli.options_from(parse("--quick")).repeats == 1
    assert vllm_cli.options_from(parse("--quick", "--repeat", "3")).repeats == 3


@pytest.mark.parametrize("value", ["0", "-1", "101", "two", "1.5"])
def test_repeat_out_of_range_is_refused(value, capsys):
    with pytest.raises(SystemExit):
        parse("--repeat", value)
    assert "expected an integer from 1 to 100" in capsys.readouterr().err


def test_every_round_serves_every_n_with_seeds_of_its_own(tmp_path):
    options = VllmBenchOptions(model="tiny", output_dir=str(tmp_path), repeats=3)
    phases = VllmBench(options).phases()
    assert [(p["round"], p["conversations"]) for p in phases] == [
        (r, n) for r in range(3) for n in (4, 8, 16)
    ]
    assert len({p["seed"] for p in phases}) == 9
    assert [p["seed"] for p in phases[:3]] == [4, 8, 16]  # round 0: as without --repeat
    assert phases[3]["seed"] == 4 + ROUND_SEED_STEP


class FakeEngine:
    asked: ClassVar[list[tuple[str, str]]] = []

    def __init__(self, name: str) -> None:
        self.name = name

    def ask(self, command: str | None, reply: str) -> None:
        if command is not None:
            FakeEngine.asked.append((command, self.name))

    def finish(self) -> dict[str, object]:
        return {"name": self.name}

    def stop(self) -> None:
        pass


def test_the_rounds_interleave_the_strategies_phase_by_phase(tmp_path, monkeypatch):
    names = ("vllm-fs", "kvtier-fs")
    monkeypatch.setattr(
        vllm_bench.Engine, "start", classmethod(lambda cls, py, sc, wd: FakeEngine(sc["engine_id"]))
    )
    FakeEngine.asked = []
    options = VllmBenchOptions(
        model="tiny", output_dir=str(tmp_path), repeats=2, conversations=(2, 6), strategies=names
    )
    VllmBench(options).run()
    order = [(int(i), name.split("-bench-")[1].rsplit("-", 1)[0]) for i, name in FakeEngine.asked]
    assert [i for i, _ in order] == [0, 0, 1, 1, 2, 2, 3, 3]
    # turned at the second N, reversed in the second round: at each N the two swap places
    v, k = "vllm-fs", "kvtier-fs"
    assert [s for _, s in order] == [v, k, k, v, k, v, v, k]


def phase(turn: int, n: int, seconds: float, ttft: float, cpu: float) -> dict[str, object]:
    request = {"key": "0/0", "one_shot": False, "prompt_tokens": 90, "tokens": [1] * 10,
               "ttft_s": ttft, "itl_s": [0.01]}  # fmt: skip
    return {"round": turn, "conversations": n, "seconds": seconds, "cpu_seconds": cpu,
            "requests": [request], "grown": {}}  # fmt: skip


def report(speed: float, rounds: int) -> dict[str, object]:
    """A runner report: N=2 at ``speed`` times vllm-fs's pace, N=6 at the same pace."""
    noise = [1.0, 1.05, 0.95, 1.02, 0.98, 1.01][:rounds]
    phases = [
        phase(r, n, s * f, 0.1 * s * f, 0.5)
        for r, f in enumerate(noise)
        for n, s in ((2, 1 / speed), (6, 1.0 + 0.3 * (r % 2) * (speed != 1)))
    ]
    return {"phases": phases, "disk_bytes": {}, "load_seconds": 1.0}


class _Model:
    path, dummy, block_bytes = Path("m"), True, 1


def document(rounds: int) -> dict[str, object]:
    reports = {"vllm-fs": report(1.0, rounds), "kvtier-fs": report(1.25, rounds)}
    table = vllm_report.rows(reports)
    opts = VllmBenchOptions(repeats=rounds)
    return vllm_report.to_json(opts, Pools(1, 1, 1, 1), _Model(), reports, table)


def test_the_report_judges_each_n_over_the_rounds(tmp_path):
    doc = document(6)  # the fewest rounds with a 95 % interval
    assert len(doc["kvtier_fs_vs_vllm_fs"]) == 12
    by_n = {item["conversations"]: item for item in doc["kvtier_fs_vs_vllm_fs_verdict"]}
    ahead, mixed = by_n[2], by_n[6]
    assert ahead["rounds"] == 6 and ahead["verdict"] == "ahead"
    assert ahead["throughput"]["median"] == 1.25 and ahead["throughput"]["low"] > 1
    assert ahead["ttft_p99"]["verdict"] == "ahead" and ahead["cpu_per_request"]["median"] == 1
    assert ahead["ttft_p50"]["median"] == 0.8 and "verdict" not in ahead["ttft_p50"]  # shown
    assert mixed["verdict"] == "no difference shown"  # 1.0 or 0.77 by round: touches 1.0
    lines = vllm_report.ratio_lines(doc)
    assert lines[0].startswith("round 1 N=2: kvtier-fs / vllm-fs throughput 1.25x")
    assert (
        "N=2: throughput 1.250x [1.250, 1.251], TTFT p99 0.800x [0.800, 0.800], "
        "TTFT p50 0.800x [0.800, 0.800], CPU/request" in "\n".join(lines)
    )
    assert lines[-2].endswith(": ahead") and lines[-1].endswith(": no difference shown")
    assert "round" in vllm_report.format_table(doc["results"]).splitlines()[0]
    chart = tmp_path / "chart.png"
    vllm_report.write_chart(doc["results"], "t", chart, doc["kvtier_fs_vs_vllm_fs_verdict"])
    assert chart.stat().st_size > 0
    json.dumps(doc)


def test_one_round_gives_no_interval_and_says_so():
    doc = document(1)
    item = doc["kvtier_fs_vs_vllm_fs_verdict"][0]
    assert item["throughput"]["low"] is None and item["verdict"] == "no difference shown"
    assert "1.250x (1 round: no interval)" in "\n".join(vllm_report.ratio_lines(doc))
    assert "round" not in vllm_report.format_table(doc["results"]).splitlines()[0]


def test_the_cpu_time_of_this_process_is_counted():
    before = tree_cpu_seconds()
    total = sum(i * i for i in range(3_000_000))
    assert total > 0 and tree_cpu_seconds() >= before


def test_a_preset_model_directory_can_be_fingerprinted(tmp_path):
    from kvtier.bench.vllm_strategies import Model
    from kvtier.model_fingerprint import fingerprint_model

    first = fingerprint_model(str(Model.resolve("tiny", tmp_path / "a").path))
    again = fingerprint_model(str(Model.resolve("tiny", tmp_path / "b").path))
    assert first is not None and again is not None and first.digest == again.digest


@pytest.mark.parametrize("with_ceiling", [False, True])
def test_the_chart_draws_a_fraction_of_the_ceiling_only_when_one_ran(tmp_path, with_ceiling):
    """Without a ceiling the fraction panel would be a flat line at 0: it is left out."""
    from matplotlib.image import imread

    table = document(5)["results"]
    if with_ceiling:
        table = table + [dict(row, strategy="ceiling") for row in table]
    chart = tmp_path / "chart.png"
    vllm_report.write_chart(table, "t", chart, document(5)["kvtier_fs_vs_vllm_fs_verdict"])
    panels = 5 if with_ceiling else 4  # throughput, [fraction], TTFT p50, p99, the intervals
    assert imread(chart).shape[1] == 500 * panels


@pytest.mark.parametrize(
    ("mine", "other", "expected"),
    [(2.0, 1.0, 2.0), (1.0, 0.0, None), (0.0, 1.0, 0.0), (None, 1.0, None), (1.0, None, None),
     (float("nan"), 1.0, None), (1.0, float("inf"), None), (1.0, -1.0, None)],
)  # fmt: skip
def test_a_ratio_over_nothing_is_left_out_not_a_crash_or_a_huge_number(mine, other, expected):
    """A phase with 0 tok/s raised ZeroDivisionError after a run of minutes; a 0 ms TTFT p99
    gave a ratio of 1e9 and a confident verdict."""
    from kvtier.bench.engine_report import pair_lines, ratio

    assert ratio(mine, other) == expected
    item = {"round": 0, "conversations": 2, "throughput_ratio": expected, "ttft_p99_ratio": 1.0}
    line = pair_lines([item], "a / b")[0]
    assert line.startswith("N=2: a / b throughput " + ("n/a" if expected is None else ""))


def test_each_row_says_how_long_the_engine_waited_for_its_trailing_writes():
    """``settle_seconds`` (``phase.settle_writes``, after the phase's clock stopped) is in each
    row of the JSON and changes none of the phase's figures; a runner that did not settle (an
    older one) reports ``None``, not a wait of 0."""
    waited = phase(0, 2, 1.0, 0.1, 0.5) | {"settle_seconds": 0.43219}
    reports = {
        "vllm-fs": {"phases": [waited], "disk_bytes": {}, "load_seconds": 1.0},
        "kvtier-fs": {"phases": [phase(0, 2, 1.0, 0.1, 0.5)], "disk_bytes": {},
                      "load_seconds": 1.0},
    }  # fmt: skip
    rows = {row["strategy"]: row for row in vllm_report.rows(reports)}
    assert rows["vllm-fs"]["settle_seconds"] == 0.432
    assert rows["kvtier-fs"]["settle_seconds"] is None
    same = {k: v for k, v in rows["vllm-fs"].items() if k not in ("strategy", "settle_seconds")}
    assert same == {
        k: v for k, v in rows["kvtier-fs"].items() if k not in ("strategy", "settle_seconds")
    }


def test_ttft_p50_is_shown_but_never_judged():
    ratios = [
        {"conversations": 4, "throughput_ratio": 1.2 + 0.01 * r, "ttft_p99_ratio": 0.8,
         "ttft_p50_ratio": 1.5 + 0.01 * r, "cpu_ratio": None}
        for r in range(6)
    ]  # fmt: skip
    (item,) = pair_verdict.verdicts(ratios)
    assert item["ttft_p50"]["low"] > 1.0  # behind by p50 alone
    assert item["verdict"] == "ahead" and "verdict" not in item["ttft_p50"]
    assert "cpu_per_request" not in item  # not measured: left out
