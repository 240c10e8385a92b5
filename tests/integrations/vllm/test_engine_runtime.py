"""The runtime of a vLLM engine, the vLLM-free parts: one per engine id, configured from the
extra config's kvtier keys (or refused naming the key), its endpoint up while a tier uses it,
and retention that cannot act counted. The real engine: ``test_operator_plane.py``."""

from __future__ import annotations

import json
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest

from kvtier.core.tier_set import Retired
from kvtier.errors import ConfigError
from kvtier.integrations.vllm import engine as engines
from kvtier.integrations.vllm.engine_config import engine_config, unknown_keys
from tests.control.test_admin import free_port
from tests.integrations.vllm.test_retention import Context


def spec(engine_id: str, **extra: Any) -> Any:
    """The parts of vLLM's offloading spec the runtime reads."""
    return SimpleNamespace(config=SimpleNamespace(engine_id=engine_id), extra_config=extra)


def test_tiers_of_one_engine_share_a_runtime_and_another_engine_gets_its_own():
    a1, a2 = engines.join(spec("a"), 4096), engines.join(spec("a"), 4096)
    b = engines.join(spec("b"), 4096)
    try:
        assert a1 is a2 and a1.users == 2 and b is not a1
    finally:
        for engine in (a1, a2, b):
            engines.leave(engine)
    assert a1.runtime.closed and b.runtime.closed
    assert engines.join(spec("a"), 4096) is not a1  # a new engine with the same id starts anew
    engines.leave(engines._engines["a"])


def test_the_endpoint_serves_while_a_tier_is_joined_and_closes_with_the_last():
    port = free_port()
    first = engines.join(spec("m", metrics_port=port, metrics_admin=True), 4096)
    first.runtime.add_tier(Retired("fs"))
    first.runtime.bind()
    second = engines.join(spec("m", metrics_port=port, metrics_admin=True), 4096)
    url = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(f"{url}/admin/tiers", timeout=10) as answer:
        assert json.loads(answer.read()) == {"enabled": ["fs"], "disabled": []}
    engines.leave(first)
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        assert b"kvtier_tier_enabled" in answer.read()
    engines.leave(second)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/metrics", timeout=5)


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"slo_guard": {"promotion_p99_s": -1}}, "slo_guard.promotion_p99_s"),
        ({"slo_guard": {"promotion_p99_s": float("nan")}}, "slo_guard.promotion_p99_s"),
        ({"slo_guard": {"ttft_p99_s": 1.0}}, "slo_guard.ttft_p99_s"),
        ({"slo_guard": {"itl_p99_s": 1.0}}, "slo_guard.itl_p99_s"),
        ({"admission": [{"level": "fs", "min_reuse": 2}]}, "admission"),
        ({"serve": {"port": 5555}}, "serve"),
        ({"kv_events": {}}, "kv_events"),
        ({"trace_path": "/tmp/t"}, "trace_path"),
        ({"metrics_admin": True}, "metrics_admin"),
        ({"metrics_port": 0}, "metrics_port"),
        ({"metrics_port": 65536}, "metrics_port"),
        ({"metrics_port": 9100, "metrics_host": "0.0.0.0", "metrics_admin": True}, "metrics_admin"),
        ({"secondary_min_priority": 101}, "secondary_min_priority"),
        ({"secondary_min_priority": -1}, "secondary_min_priority"),
        ({"secondary_min_priority": True}, "secondary_min_priority"),
        ({"tune_malloc": "no"}, "tune_malloc"),
        ({"tune_malloc": 0}, "tune_malloc"),
    ],
)
def test_a_kvtier_key_that_cannot_be_honoured_fails_the_start_naming_it(extra, key):
    with pytest.raises(ConfigError, match=rf"kv_connector_extra_config\.{key}"):
        engines.join(spec(f"bad-{key}", **extra), 4096)
    assert f"bad-{key}" not in engines._engines


def test_the_edges_of_each_range_are_taken():
    for value in (0, 100):
        assert engine_config({"secondary_min_priority": value}).secondary_min_priority == value
    for port in (1, 65535):
        assert engine_config({"metrics_port": port}).metrics_port == port
    guard = engine_config({"slo_guard": {"promotion_p99_s": 0.5}}).slo_guard
    assert guard is not None and guard.promotion_p99_s == 0.5
    assert engine_config({}).tune_malloc is True
    assert engine_config({"tune_malloc": False}).tune_malloc is False


def test_keys_neither_vllm_nor_kvtier_reads_are_reported():
    extra = {"cpu_bytes_to_use": 1, "metrics_port": 9100, "metrics_prot": 9100, "spec_name": "x"}
    assert unknown_keys(extra) == ["metrics_prot"]


def test_retention_that_cannot_act_on_host_memory_is_counted_once_per_request(caplog):
    plain = engines.join(spec("plain", eviction_policy="lru"), 4096)
    policy = engines.join(
        spec(
            "policy",
            eviction_policy="KvtierPriorityPolicy",
            cache_policy_module_path="kvtier.integrations.vllm",
        ),
        4096,
    )
    try:
        asks = {"kvtier_retention": {"priority": 90}}
        for engine in (plain, policy):
            context = Context(asks)
            engine.note_request(context)
            engine.note_request(context)  # every tier sees the request: counted once
            engine.note_request(Context(None))  # no retention asked: nothing to say
            bad = Context({"kvtier_retention": {"priority": 500}})
            bad.req_id = "r2"
            engine.note_request(bad)
        ignored = "kvtier_retention_ignored_total"
        assert plain.runtime.metrics.telemetry.get(ignored, reason="no_priority_policy") == 1
        assert policy.runtime.metrics.telemetry.get(ignored, reason="no_priority_policy") == 0
        for engine in (plain, policy):
            assert engine.runtime.metrics.telemetry.get(ignored, reason="invalid") == 1
        assert "KvtierPriorityPolicy" in caplog.text
    finally:
        engines.leave(plain)
        engines.leave(policy)


KVTIER_FS = {"type": "KvtierFs", "module_path": "kvtier.integrations.vllm", "root_dir": "/kv"}


@pytest.mark.parametrize(
    ("extra", "tiers_run", "refused"),
    [
        ({"metrics_port": 9100, "secondary_tiers": [KVTIER_FS]}, True, None),
        ({"metrics_port": 9100, "secondary_tiers": [{"type": "fs", "root_dir": "/kv"}]}, True,
         "metrics_port"),
        ({"slo_guard": {"promotion_p99_s": 1}}, True, "slo_guard"),
        ({"metrics_port": 9100, "secondary_tiers": [KVTIER_FS]}, False, "metrics_port"),
        ({"secondary_tiers": [KVTIER_FS]}, False, None),
        ({"cpu_bytes_to_use": 1}, False, None),
    ],
)  # fmt: skip
def test_runtime_keys_with_no_kvtier_tier_to_honour_them_are_refused(extra, tiers_run, refused):
    from kvtier.integrations.vllm.engine_config import refuse_orphan_runtime_keys

    if refused is None:
        refuse_orphan_runtime_keys(extra, tiers_run)
        return
    with pytest.raises(ConfigError, match=rf"kv_connector_extra_config\.{refused}: "):
        refuse_orphan_runtime_keys(extra, tiers_run)


def test_regions_removed_at_start_are_counted_by_the_engines_runtime(monkeypatch):
    from kvtier.integrations.vllm import shm

    monkeypatch.setattr(shm, "regions_removed", lambda: 2)
    monkeypatch.setattr(shm, "bytes_removed", lambda: 3 << 20)
    engine = engines.join(spec("swept"), 4096)
    try:
        telemetry = engine.runtime.metrics.telemetry
        assert telemetry.get("kvtier_shm_regions_removed_total") == 2
        assert telemetry.get("kvtier_shm_bytes_removed_total") == 3 << 20
    finally:
        engines.leave(engine)
