"""Fails when SGLang's storage-backend interface changes under kvtier.

``TESTED`` records, for the SGLang versions kvtier was tested with (build_env.sh pins them),
the parameters of every ``HiCacheStorage`` method kvtier implements and the abstract ones. A
new SGLang that renames or adds a parameter, or makes another method abstract, fails here
before it fails a server: update the backend, then this table and the pin.
"""

from __future__ import annotations

import pytest

from tests.integrations.sglang.conftest import in_venv
from tests.integrations.sglang.engine import SGLANG_VERSION, SglangEnv

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(1800)]  # the venv may be built first

_V1 = ["keys", "host_indices", "extra_info"]
_V2 = ["transfers", "extra_info"]
#: SGLang 0.5.23's parameters of the methods kvtier implements.
TESTED_VERSIONS = ("0.5.23",)
TESTED = {
    "register_mem_pool_host": ["mem_pool_host"],
    "register_mem_host_pool_v2": ["host_pool", "host_pool_name"],
    "on_host_pools_registered": [],
    "batch_exists": ["keys", "extra_info"],
    "batch_get_v1": _V1,
    "batch_set_v1": _V1,
    "get": ["key", "target_location", "target_sizes"],
    "set": ["key", "value", "target_location", "target_sizes"],
    "batch_get": ["keys", "target_locations", "target_sizes"],
    "batch_set": ["keys", "values", "target_locations", "target_sizes"],
    "exists": ["key"],
    "batch_exists_v2": ["keys", "pool_transfers", "extra_info"],
    "batch_get_v2": _V2,
    "batch_set_v2": _V2,
    "clear": [],
    "get_stats": [],
}
ABSTRACT = ["batch_get", "batch_set", "exists", "get", "set"]


def test_sglang_signatures_are_the_tested_ones(sglang_env: SglangEnv) -> None:
    found = in_venv(sglang_env, "signatures")
    assert found["version"] in TESTED_VERSIONS and SGLANG_VERSION in TESTED_VERSIONS
    assert found["sglang"] == TESTED, "SGLang's HiCacheStorage changed: update the backend"
    assert found["abstract"] == ABSTRACT
    kvtier = dict(found["kvtier"])
    assert kvtier.pop("__init__") == ["storage_config", "kwargs"]  # the factory's call
    assert kvtier == TESTED, "kvtier's methods must take SGLang's parameters, by name"
