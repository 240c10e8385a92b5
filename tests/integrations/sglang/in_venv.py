"""Run inside the SGLang test venv by the tests here (``python in_venv.py COMMAND``).

* ``signatures``: the ``inspect.signature`` of every ``HiCacheStorage`` method kvtier
  implements, and of kvtier's own, as JSON (``test_version.py`` compares them to its table);
* ``factory ROOT``: kvtier's backend built by SGLang's own ``StorageBackendFactory``, the way
  ``--hicache-storage-backend dynamic`` builds it, then a round trip through it; prints JSON.
"""

from __future__ import annotations

import inspect
import json
import sys
from typing import Any

METHODS = (
    "__init__", "register_mem_pool_host", "register_mem_host_pool_v2", "on_host_pools_registered",
    "batch_exists", "batch_get_v1", "batch_set_v1", "get", "set", "batch_get", "batch_set",
    "exists", "batch_exists_v2", "batch_get_v2", "batch_set_v2", "clear", "get_stats",
)  # fmt: skip


def _parameters(function: Any) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


def signatures() -> dict[str, Any]:
    import sglang
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

    from kvtier.integrations.sglang import KvtierHiCacheStorage

    return {
        "version": sglang.__version__,
        "sglang": {m: _parameters(getattr(HiCacheStorage, m)) for m in METHODS if m != "__init__"},
        "kvtier": {m: _parameters(getattr(KvtierHiCacheStorage, m)) for m in METHODS},
        "abstract": sorted(HiCacheStorage.__abstractmethods__),
    }


def factory(root: str) -> dict[str, Any]:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolTransferResult
    from sglang.srt.mem_cache.storage import StorageBackendFactory
    from sglang.srt.observability.metrics_collector import StorageMetrics

    from tests.integrations.sglang.host_pool import MhaHostPool, extra, page_keys

    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=True, is_page_first_layout=True,
        model_name="test-org/test-model", extra_config=extra(root),
    )  # fmt: skip
    pool = MhaHostPool()
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)
    backend.on_host_pools_registered()
    keys = page_keys(3, "factory")
    for page in range(3):
        pool.fill(page, seed=page)
    written = backend.batch_set_v1(keys, pool.page_indices([0, 1, 2]))
    found = backend.batch_exists(keys)
    read = backend.batch_get_v1(keys, pool.page_indices([5, 6, 7]))
    same = all(bool((pool.page(i) == pool.page(5 + i)).all()) for i in range(3))
    stats = backend.get_stats()
    v2 = backend.batch_exists_v2(keys)
    bad = extra(root, secondary_tiers=[{"type": "fs", "root_dir": root, "max_bytes": -1}])
    try:
        StorageBackendFactory.create_backend("dynamic", _with(config, bad), pool)
        refused = ""
    except Exception as exc:
        refused = str(exc)
    backend.close()
    return {
        "class": type(backend).__name__, "written": written, "found": found, "read": read,
        "same": same, "stats": isinstance(stats, StorageMetrics) and stats.backup_pgs == [3],
        "v2": isinstance(v2, PoolTransferResult) and v2.kv_hit_pages == 0, "refused": refused,
    }  # fmt: skip


def _with(config: Any, extra_config: dict[str, Any]) -> Any:
    import dataclasses

    return dataclasses.replace(config, extra_config=extra_config)


if __name__ == "__main__":
    command = sys.argv[1]
    result = signatures() if command == "signatures" else factory(sys.argv[2])
    print("RESULT " + json.dumps(result))
