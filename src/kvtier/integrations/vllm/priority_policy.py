"""Retention priority for vLLM's host memory: an out-of-tree vLLM cache policy.

In ``kv_connector_extra_config`` (``TieringOffloadingSpec`` or ``CPUOffloadingSpec``, and our
``CPUTieringOffloadingSpec`` / ``CPUHostOffloadingSpec``)::

    "eviction_policy": "KvtierPriorityPolicy",
    "cache_policy_module_path": "kvtier.integrations.vllm"

``KvtierPriorityPolicy`` evicts the lowest priority first, then the least recently used;
``KvtierPriorityARCPolicy`` uses ARC within a priority. Requests give priorities in their
``kv_transfer_params``, within the operator's caps, and the operator in their ``kv_hints``
(``request_retention``); without any, both behave as vLLM's own LRU / ARC, and chunks keep the
priority they have. The state is ``priority_cache.PriorityCache``; vLLM calls every method on
its scheduler thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus, order_request_keys

from kvtier.integrations.vllm.priority_cache import PriorityCache
from kvtier.integrations.vllm.request_retention import retention_by_key


class KvtierPriorityPolicy(CachePolicy):
    """vLLM ``CachePolicy``: priority levels (``kvtier_retention``) over LRU."""

    base = "lru"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.cache: PriorityCache[ChunkStatus] = PriorityCache(cache_capacity, self.base)

    def get(self, key: Any) -> ChunkStatus | None:
        return self.cache.chunks.get(key)

    def insert(self, key: Any, chunk: ChunkStatus) -> None:
        self.cache.insert(key, chunk, evictable=chunk.ref_cnt == 0)

    def remove(self, key: Any) -> None:
        self.cache.remove(key)

    def touch(self, keys: Iterable[Any], req_context: Any) -> None:
        self.cache.use(list(keys), retention_by_key(req_context))

    def on_store_miss(self, keys: Iterable[Any], req_context: Any) -> None:
        self.cache.note_new(keys, retention_by_key(req_context))

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[Any]],
        insertion_only_keys: set[Any],
        reused_keys: set[Any],
        req_context: Any,
    ) -> None:
        keys = order_request_keys(key_groups, req_context)
        # LRU re-orders new chunks too (the head most recent); ARC must not count their
        # insertion as a second use.
        fresh = insertion_only_keys if self.base == "arc" else ()
        self.cache.use(keys, retention_by_key(req_context), fresh=fresh)

    def evict(self, n: int, protected: set[Any]) -> list[tuple[Any, ChunkStatus]] | None:
        return self.cache.evict(n, protected)

    def clear(self) -> None:
        self.cache.clear()

    def mark_evictable(self, key: Any) -> None:
        self.cache.mark(key, evictable=True)

    def mark_non_evictable(self, key: Any) -> None:
        self.cache.mark(key, evictable=False)


class KvtierPriorityARCPolicy(KvtierPriorityPolicy):
    """vLLM ``CachePolicy``: priority levels (``kvtier_retention``) over ARC."""

    base = "arc"
