"""The plan's vLLM line (issue 23, finding 1): every emitted JSON is one that ``kvtier config
check`` accepts for its target and whose extra config kvtier's engine runtime accepts
(``engine_config``); kvtier's tiers, never vLLM's ``fs`` with ``max_bytes``; the spec of the
target; the recommended admission where vLLM can take it; a base config carried over where
vLLM allows, and what it does not allow named."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvtier.integrations.vllm.check import Shape, check_vllm
from kvtier.integrations.vllm.engine_config import engine_config
from kvtier.plan.analysis import GiB, PlanOptions, analyze
from kvtier.plan.cost import DEFAULTS
from kvtier.plan.verdict import ADMISSION_NAME, HOST_AND_FS, recommend
from kvtier.plan.vllm_line import vllm_line
from tests.plan.helpers import cyclic_docs

MODULE = "kvtier.integrations.vllm"
SHAPE = {"vllm-cpu": Shape(1, 1, 512, "float16", 128), "vllm-cuda": Shape(1, 1, 512, "float16", 16)}
OTHER = {"vllm-cpu": "vllm-cuda", "vllm-cuda": "vllm-cpu"}


@pytest.fixture(scope="module")
def planned() -> Any:
    """A host + fs recommendation: 1200 chunks of cyclic reuse, room for 1024 (2 KiB/token)."""
    options = PlanOptions(
        bytes_per_token=2048,
        chunk_tokens=256,
        engine_block_size=128,
        device_bytes=2 << 20,
        host_memory=4 * GiB,
        process_bytes=2 * GiB + 512 * (1 << 20),
        page_cache_bytes=0,
    )
    analysis = analyze(cyclic_docs(300, 4, 3000, 256), options)
    rec = recommend(analysis, DEFAULTS)
    assert rec.verdict == HOST_AND_FS and rec.fs_max_bytes is not None, rec.reasons
    return analysis, rec


def accepted(config: dict[str, Any], target: str) -> dict[str, Any]:
    """``config``'s extra config, after the checks vLLM's engine and kvtier's runtime make."""
    check_vllm(config, target, SHAPE[target])
    extra: dict[str, Any] = config["kv_connector_extra_config"]
    engine_config(extra)
    return extra


@pytest.mark.parametrize(
    ("target", "spec"),
    [("vllm-cpu", {"spec_name": "CPUTieringOffloadingSpec", "spec_module_path": MODULE}),
     ("vllm-cuda", {"spec_name": "TieringOffloadingSpec"})],
)  # fmt: skip
def test_host_and_fs_is_kvtier_fs_under_the_targets_spec(planned, target, spec):
    analysis, rec = planned
    line = vllm_line(rec, analysis, "/data/kv", target)
    extra = accepted(line.config, target)
    assert {k: extra.get(k) for k in spec} == spec
    assert extra["secondary_tiers"] == [
        {
            "type": "KvtierFs",
            "module_path": MODULE,
            "root_dir": "/data/kv",
            "max_bytes": rec.fs_max_bytes,
        }
    ]
    assert extra["cpu_bytes_to_use"] == rec.cpu_bytes_to_use and extra["block_size"] == 256
    with pytest.raises(Exception, match="spec_name"):  # the other build would not start it
        check_vllm(line.config, OTHER[target], SHAPE[OTHER[target]])


def test_second_use_admission_goes_to_the_tier_entry(planned):
    analysis, rec = planned
    line = vllm_line(replace(rec, admission=ADMISSION_NAME), analysis, "/kv", "vllm-cpu")
    extra = accepted(line.config, "vllm-cpu")
    assert extra["secondary_tiers"][0]["admission"] == {"min_reuse": 2}
    assert "store_threshold" not in extra and "admission" not in extra
    assert any("store_threshold" in note for note in line.notes)
    assert (
        "admission"
        not in vllm_line(rec, analysis, "/kv", "vllm-cpu").config["kv_connector_extra_config"][
            "secondary_tiers"
        ][0]
    )


@pytest.mark.parametrize(
    ("target", "spec"), [("vllm-cpu", "CPUHostOffloadingSpec"), ("vllm-cuda", "CPUOffloadingSpec")]
)
def test_host_only_admission_is_vllms_store_threshold(planned, target, spec):
    analysis, rec = planned
    host_only = replace(rec, verdict="host_only", fs_max_bytes=None, admission=ADMISSION_NAME)
    extra = accepted(vllm_line(host_only, analysis, "/kv", target).config, target)
    assert extra["spec_name"] == spec and extra["store_threshold"] == 2
    assert "secondary_tiers" not in extra


def test_a_base_config_is_carried_over_where_vllm_allows(planned):
    analysis, rec = planned
    base = {
        "cpu_bytes_to_use": 1,
        "metrics_port": 9464,
        "metrics_admin": True,
        "tune_malloc": False,
        "serve": {"port": 5710},
        "trace_path": "/t.jsonl",
        "slo_guard": {"promotion_p99_s": 0.5, "ttft_p99_s": 2.0},
        "secondary_tiers": [
            {"type": "fs", "root_dir": "/nvme", "fsync": True},
            {"type": "obj", "bucket": "kv"},
            {"type": "memory"},
        ],
    }
    line = vllm_line(rec, analysis, "/unused", "vllm-cpu", base)
    extra = accepted(line.config, "vllm-cpu")
    assert extra["metrics_port"] == 9464 and extra["metrics_admin"] is True
    assert extra["tune_malloc"] is False
    assert extra["slo_guard"] == {"promotion_p99_s": 0.5}
    assert "serve" not in extra and "trace_path" not in extra
    assert [t["type"] for t in extra["secondary_tiers"]] == ["KvtierFs", "KvtierObj", "KvtierTier"]
    fs = extra["secondary_tiers"][0]
    assert fs["root_dir"] == "/nvme" and fs["fsync"] is True and fs["max_bytes"] == rec.fs_max_bytes
    assert extra["secondary_tiers"][2]["kvtier"] == {"type": "memory"}
    notes = " | ".join(line.notes)
    assert "serve left out" in notes and "trace_path left out" in notes and "ttft_p99_s" in notes


def test_a_chunk_that_is_no_multiple_of_the_engine_block_is_rounded_up(planned):
    analysis, rec = planned
    odd = replace(analysis, options=replace(analysis.options, engine_block_size=96))
    line = vllm_line(rec, odd, "/kv", "vllm-cpu")
    assert line.config["kv_connector_extra_config"]["block_size"] == 288
    assert any("rounded up" in note for note in line.notes)
    check_vllm(line.config, "vllm-cpu", Shape(1, 1, 512, "float16", 96))
