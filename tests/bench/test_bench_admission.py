"""``kvtier bench --admission`` end to end on a tiny model: every policy runs on the same mixed
workload, the JSON has the documented structure, the counts add up (not speed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvtier.bench.mixed import MixedSpec, MixedWorkload, mixed_schedule
from kvtier.bench.workload import WorkloadSpec
from kvtier.cli.main import main

TINY = [
    "bench",
    "--admission",
    "--model",
    "tiny",
    "--conversations",
    "2",
    "--rounds",
    "2",
    "--first-prompt-tokens",
    "40",
    "--user-turn-tokens",
    "6",
    "--new-tokens",
    "2",
    "--block-size",
    "4",
    "--blocks-per-chunk",
    "2",
    "--device-convs",
    "1",
    "--one-shots",
    "2",
    "--one-shot-tokens",
    "24",
    "--no-progress",
]
POLICIES = ["admit all", "host min_reuse 2", "host frequency 2"]


def run(tmp_path: Path, *argv: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / "out"
    assert main([*TINY, "--output-dir", str(out), *argv]) == 0
    assert (out / "admission.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads((out / "admission.json").read_text()), str(out)


@pytest.fixture(scope="module")
def with_tier(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A run whose ``--config`` adds a memory tier (host memory: 16 chunks of 8 KiB)."""
    tmp_path = tmp_path_factory.mktemp("admission")
    config = tmp_path / "kvtier.json"
    config.write_text(
        json.dumps(
            {
                "cpu_bytes_to_use": 16 * 8192,
                "store_threshold": 3,
                "secondary_tiers": [{"type": "memory", "name": "mem"}],
            }
        )
    )
    document, _ = run(tmp_path, "--config", str(config))
    return document


def test_every_policy_ran_on_the_same_workload(with_tier: dict[str, Any]) -> None:
    assert with_tier["mode"] == "admission"
    names = [policy["name"] for policy in with_tier["policies"]]
    assert names == [*POLICIES, "tiers min_reuse 2"]
    assert [row["policy"] for row in with_tier["results"]] == names
    prompts = {row["tokens"] for row in with_tier["results"]}
    assert len(prompts) == 1, "every policy serves the same requests and answers"
    for row in with_tier["results"]:
        assert row["answers_equal_to_admit_all"] == 1.0, row["policy"]
        assert row["conversations"] == 2 and row["throughput_tok_s"] > 0
        assert 0 <= row["follow_up_served_fraction"] <= 1
        assert set(row["ttft_ms"]) == {"p50", "p95", "p99"}


def test_the_config_admission_is_replaced_by_each_policy(with_tier: dict[str, Any]) -> None:
    """``store_threshold`` of ``--config`` does not leak into the policies compared."""
    by_name = {row["policy"]: row for row in with_tier["results"]}
    assert by_name["admit all"]["chunks_dropped"] == {}
    assert by_name["admit all"]["admission"] == []
    assert by_name["host min_reuse 2"]["admission"] == [{"level": "host", "min_reuse": 2}]


def test_drops_and_bytes_written_per_level(with_tier: dict[str, Any]) -> None:
    by_name = {row["policy"]: row for row in with_tier["results"]}
    chunk_bytes = with_tier["capacities"]["chunk_bytes"]
    everything = by_name["admit all"]["bytes_written"]
    assert set(everything) == {"host", "mem"} and everything["host"] == everything["mem"] > 0
    reuse = by_name["host min_reuse 2"]
    assert set(reuse["chunks_dropped"]) == {"host"}
    assert reuse["chunks_dropped"]["host"]["min_reuse"] == reuse["chunks_dropped_total"] > 0
    assert reuse["bytes_written"]["host"] < everything["host"]
    assert set(by_name["host frequency 2"]["chunks_dropped"]["host"]) == {"min_frequency"}
    tiers = by_name["tiers min_reuse 2"]
    assert set(tiers["chunks_dropped"]) == {"mem"}
    dropped = tiers["chunks_dropped"]["mem"]["min_reuse"]
    assert tiers["bytes_written"]["mem"] == tiers["bytes_written"]["host"] - dropped * chunk_bytes


def test_sources_count_every_prompt_token(with_tier: dict[str, Any]) -> None:
    options = with_tier["options"]
    requests = (2 + options["one_shots_per_round"]) * (options["rounds"] + 1)
    for row in with_tier["results"]:
        prompt_tokens = row["tokens"] - requests * options["new_tokens"]
        assert sum(row["prompt_tokens_from"].values()) == prompt_tokens
    assert with_tier["headline"]["conversations"] == 2


def test_host_memory_alone_without_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document, out = run(tmp_path)
    assert [policy["name"] for policy in document["policies"]] == POLICIES
    for row in document["results"]:
        assert set(row["bytes_written"]) == {"host"}
    printed = capsys.readouterr().out
    assert all(name in printed for name in POLICIES) and f"{out}/admission.json" in printed


def test_metrics_port_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*TINY, "--output-dir", str(tmp_path), "--metrics-port", "0"])
    assert exc.value.code == 2
    assert "argument --metrics-port: not with --admission" in capsys.readouterr().err


def test_one_shots_interleave_and_never_repeat() -> None:
    spec = MixedSpec(
        WorkloadSpec(
            3, first_prompt_tokens=8, rounds=2, user_turn_tokens=2, new_tokens=1, vocab_size=1000
        ),
        4,
        10,
    )
    order = mixed_schedule(spec)
    assert len(order) == spec.num_requests == 9 + 12
    for turn in range(3):
        round_ = order[turn * 7 : (turn + 1) * 7]
        assert sorted(c for c, t in round_ if c < 3) == [0, 1, 2]
        assert {t for c, t in round_ if c < 3} == {turn}
    workload = MixedWorkload(spec)
    one_shots = []
    for request in workload:
        if request.conversation >= 3:
            assert request.turn == 0 and len(request.prompt) == 10
            one_shots.append(tuple(request.prompt))
        workload.answer(request, [7])
    assert len(set(one_shots)) == 12
