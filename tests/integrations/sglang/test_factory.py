"""kvtier's backend through SGLang's own ``StorageBackendFactory``, in the SGLang venv (no
server): the dynamic loader builds ``KvtierHiCacheStorage``, pages round-trip, ``get_stats`` is
SGLang's ``StorageMetrics``, pool transfers get no hit, and a bad key fails the construction
naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations.sglang.conftest import in_venv
from tests.integrations.sglang.engine import SglangEnv

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(1800)]  # the venv may be built first


def test_sglangs_factory_builds_kvtier(sglang_env: SglangEnv, tmp_path: Path) -> None:
    result = in_venv(sglang_env, "factory", str(tmp_path / "l3"))
    assert result["class"] == "KvtierHiCacheStorage"
    assert result["written"] == [True] * 3 and result["found"] == 3
    assert result["read"] == [True] * 3 and result["same"]
    assert result["stats"] and result["v2"]
    assert "kvtier.secondary_tiers[0].max_bytes" in result["refused"]
