"""The helpers of the peer benchmarks that decide what their JSON says (``p2p_tier.py``,
``malloc_ab.py``): which CPUs each side gets, page faults per GB, and the A/B's summary."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def scripts(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("p2p_tier"), importlib.import_module("malloc_ab")


def test_pinning_splits_the_cpus_in_halves(
    scripts: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    p2p, _ = scripts
    monkeypatch.setattr(p2p.os, "sched_getaffinity", lambda pid: {3, 1, 2, 0})
    assert p2p.halves(True) == ({0, 1}, {2, 3})
    assert p2p.halves(False) is None
    monkeypatch.setattr(p2p.os, "sched_getaffinity", lambda pid: {5})
    assert p2p.halves(True) is None  # one CPU: nothing to split
    monkeypatch.setattr(p2p.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert p2p.halves(True) == ({0}, {1, 2})


def test_faults_per_gb_is_the_median_round_over_the_payload(scripts: tuple[Any, Any]) -> None:
    p2p, _ = scripts
    rounds = [{"raw": 10.0, "tier": 500.0}, {"raw": 30.0, "tier": 100.0}, {"raw": 20.0, "tier": 0}]
    assert p2p.faults_per_gb(500_000_000, rounds) == {
        "raw_faults_per_gb": 40,
        "tier_faults_per_gb": 200,
    }


def test_the_ab_compares_pair_by_pair(scripts: tuple[Any, Any]) -> None:
    _, ab = scripts
    off = [{"row": {"value": v, "ratio": r}} for v, r in ((2.0, 0.5), (4.0, 0.7), (3.0, 0.6))]
    on = [{"row": {"value": v, "ratio": 0.9}} for v in (3.0, 4.4, 3.6)]
    row = ab.summary({"off": off, "on": on})["row"]
    assert row["off"] == {"value": [2.0, 4.0, 3.0], "ratio": 0.6}
    assert row["on"]["ratio"] == 0.9
    assert row["on_over_off"]["median"] == pytest.approx(1.2)  # 1.5, 1.1, 1.2
    assert row["on_over_off"]["rounds"] == 3


def test_a_child_gets_none_of_the_operators_malloc_settings(
    scripts: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, ab = scripts
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.check=0")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")
    monkeypatch.setenv("KVTIER_PROBE", "kept")
    code = "import os; print(sorted(k for k in os.environ if 'MALLOC' in k or 'GLIBC' in k))"
    assert ab.child([sys.executable, "-c", code]).strip() == "[]"
    code = "import os; print(os.environ['KVTIER_PROBE'])"
    assert ab.child([sys.executable, "-c", code]).strip() == "kept"
