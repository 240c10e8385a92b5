"""KvtierHiCacheStorage: ``HiCacheBackend`` as SGLang's ``HiCacheStorage`` (imports SGLang).

SGLang's ``StorageBackendFactory`` loads it with ``--hicache-storage-backend dynamic`` and
``"module_path": "kvtier.integrations.sglang", "class_name": "KvtierHiCacheStorage"`` in the
extra config, checks that it subclasses ``HiCacheStorage`` and calls ``cls(storage_config,
kwargs)``. Everything is ``HiCacheBackend``'s; this class adds what needs SGLang's types:

* the model path and revision of the server (``--model-path``, ``--revision``) for the cache
  identity, from SGLang's ``get_server_args`` where the scheduler process has it;
* the pool-transfer calls of hybrid models (``*_v2``), which are never a hit;
* ``get_stats`` as SGLang's ``StorageMetrics``.

Thread safety: as ``HiCacheBackend``.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolTransferResult

from kvtier.integrations.sglang.backend import HiCacheBackend


def _server_args() -> tuple[str | None, str]:
    """SGLang's ``--model-path`` and ``--revision`` in this process (``None``, ``""`` when it
    cannot say: a backend built outside a server)."""
    try:
        from sglang.srt.runtime_context import get_server_args

        args = get_server_args()
    except Exception:
        return None, ""
    return getattr(args, "model_path", None), str(getattr(args, "revision", None) or "")


class KvtierHiCacheStorage(HiCacheBackend, HiCacheStorage):
    """kvtier's tiers as SGLang's HiCache L3 (module docstrings of this and ``backend``)."""

    def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
        model_path, revision = _server_args()
        HiCacheBackend.__init__(
            self, storage_config, kwargs, model_path=model_path, revision=revision
        )

    def batch_exists_v2(
        self, keys: list[str], pool_transfers: Any = None, extra_info: Any = None
    ) -> PoolTransferResult:
        """No hit with sidecar pools: kvtier stores the KV pool only."""
        return PoolTransferResult(0, {}, [])

    def batch_get_v2(self, transfers: list[Any], extra_info: Any = None) -> dict[str, list[bool]]:
        return {str(t.name): [False] * len(t.keys or []) for t in transfers}

    def batch_set_v2(self, transfers: list[Any], extra_info: Any = None) -> dict[str, list[bool]]:
        return {str(t.name): [False] * len(t.keys or []) for t in transfers}

    def get_stats(self) -> Any:
        from sglang.srt.observability.metrics_collector import StorageMetrics

        return StorageMetrics(**self.take_stats())
