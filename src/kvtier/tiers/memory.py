"""MemoryTier: chunks copied into process memory, with a capacity bound (LRU).

The reference tier: simple enough to trust, real enough (it copies every byte, on its own
threads) to exercise the manager's asynchronous paths.

Thread safety: ``_chunks`` is guarded by ``_lock``; jobs run on the tier's threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar

from kvtier.config.checks import Bytes, GiB, Threads, TierName, check_fields
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import HIT, MISS, Lookup, TransferJob
from kvtier.tiers.shared.jobs import JobRunner, PooledTier


@dataclass(frozen=True)
class MemoryTierConfig:
    """``type: "memory"``: chunks copied into process memory, bounded by ``capacity_bytes``."""

    type_name: ClassVar[str] = "memory"
    capacity_bytes: Bytes = GiB
    n_threads: Threads = 2
    name: TierName | None = None

    def __post_init__(self) -> None:
        check_fields(self)


class MemoryTier(PooledTier):
    """Keeps up to ``capacity_bytes`` of chunks as ``bytes`` objects, evicting the oldest."""

    def __init__(
        self, config: MemoryTierConfig, region: HostRegion, identity: CacheIdentity
    ) -> None:
        self.name = config.name or "memory"
        self._region = region
        self._capacity = config.capacity_bytes // max(1, region.slot_bytes)
        self._chunks: OrderedDict[ChunkKey, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self._runner = JobRunner(self.name, config.n_threads, config.n_threads)

    def lookup(self, key: ChunkKey) -> Lookup:
        with self._lock:
            return HIT if key in self._chunks else MISS

    def close(self) -> None:
        self._runner.close()

    def _store(self, job: TransferJob) -> list[ChunkKey]:
        copies = [bytes(self._region.view(slot)) for slot in job.slots]
        with self._lock:
            for key, data in zip(job.keys, copies, strict=True):
                self._chunks[key] = data
                self._chunks.move_to_end(key)
            while len(self._chunks) > self._capacity:
                self._chunks.popitem(last=False)
        return list(job.keys)

    def _load(self, job: TransferJob) -> list[ChunkKey]:
        loaded = []
        for key, slot in zip(job.keys, job.slots, strict=True):
            with self._lock:
                data = self._chunks.get(key)
                if data is not None:
                    self._chunks.move_to_end(key)
            if data is not None:
                self._region.view(slot)[:] = data
                loaded.append(key)
        return loaded
