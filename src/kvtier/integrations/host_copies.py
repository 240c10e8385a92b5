"""HostCopies: one engine's copies between its device cache and kvtier's host memory.

``TieredModel`` (the transformers integration) makes them through it. A load asks the manager
how many leading chunks are ready in host, waiting out ``RETRY`` (``wait_progress``) up to
``retry_timeout_s``, and copies them straight into slots the device cache hands out
(``DeviceChunkCache.claim``); a store reserves host slots (``prepare_store``) and copies new
chunks into them. Every failure is a miss: the caller recomputes.

Copies that land after their call returns (a store on CUDA; a load past its wait) stay here
until ``finish`` or ``flush`` hands them to the manager. Until then a late load holds its
device slots (the chunks it was copying into stay referenced), so the device cache never reuses
a slot that a copy may still write.

Thread safety: none; it belongs to the engine's thread.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import torch

from kvtier.core.manager import TieringManager
from kvtier.device.pages import chunk_shape
from kvtier.device.transfer import TransferEngine
from kvtier.errors import KVTierError
from kvtier.integrations.device_chunk_cache import DeviceChunkCache
from kvtier.keys import ChunkKey
from kvtier.tiers.base import RETRY


class HostCopies:
    """Loads into ``device_cache``'s slots and stores out of the engine, through ``manager``'s
    host memory and ``transfer``; ``tokens_per_chunk`` counts loaded tokens by source."""

    def __init__(
        self,
        manager: TieringManager,
        transfer: TransferEngine,
        device_cache: DeviceChunkCache,
        retry_timeout_s: float,
        tokens_per_chunk: int,
    ) -> None:
        self.manager, self.transfer, self.device_cache = manager, transfer, device_cache
        self.retry_timeout_s, self.tokens_per_chunk = retry_timeout_s, tokens_per_chunk
        self._stores: dict[int, list[ChunkKey]] = {}
        self._late_loads: dict[int, tuple[list[ChunkKey], list[torch.Tensor]]] = {}  # past wait

    # -- load --------------------------------------------------------------------------------
    def load(self, keys: list[ChunkKey], sources: Counter[str]) -> list[torch.Tensor]:
        """The chunks of the longest prefix of ``keys`` ready in host, on the device."""
        return self.copy_in(keys[: self.lookup(keys)], sources) if keys else []

    def lookup(self, keys: list[ChunkKey]) -> int:
        """Leading ``keys`` ready in host, waiting out ``RETRY``; 0 if it never settles."""
        deadline = time.monotonic() + self.retry_timeout_s
        while (ready := self.manager.lookup(keys)) is RETRY:
            left = deadline - time.monotonic()
            if left <= 0:
                return 0
            self.manager.wait_progress(left)
        assert isinstance(ready, int)
        return ready

    def copy_in(self, keys: list[ChunkKey], sources: Counter[str]) -> list[torch.Tensor]:
        """Copy chunks ready in host to the device, counting their tokens in ``sources`` by
        origin (``host``, or the tier that promoted them); none if the copy fails."""
        if not keys:
            return []
        origins: Counter[str] = Counter()
        chunks = self._claim(len(keys))  # the device cache's own slots: no new memory
        slots = self.manager.prepare_load(keys, origins)
        try:
            job_id = self.transfer.submit_load(slots, out=chunks)
        except BaseException:
            self.manager.complete_load(keys)
            raise
        try:
            self.transfer.wait(job_id, self.retry_timeout_s)
        except BaseException as exc:  # late or interrupted: held until it lands (finish)
            if self.transfer.tracks(job_id):  # holding its chunks keeps their slots unused
                self._late_loads[job_id] = keys, chunks
            else:  # interrupted once the copy had landed and was handed out
                self.manager.complete_load(keys)
            if isinstance(exc, KVTierError):
                return []
            raise
        self.manager.complete_load(keys)
        for origin, count in origins.items():
            sources[origin] += count * self.tokens_per_chunk
        return chunks

    def _claim(self, count: int) -> list[torch.Tensor]:
        shape = chunk_shape(self.transfer.local_layout)
        return self.device_cache.claim(count, shape, self.transfer.dtype, self.transfer.device)

    # -- store -------------------------------------------------------------------------------
    def store(
        self,
        all_keys: list[ChunkKey],
        chunks: torch.Tensor,
        first_chunk: int,
        retention: dict[str, Any],
    ) -> None:
        """Chunks ``all_keys[first_chunk:]`` (``chunks``) into host memory, with their lineage
        and the request's ``retention`` (``priority``, ``duration_s``)."""
        keys = all_keys[first_chunk:]
        parent = all_keys[first_chunk - 1] if first_chunk else None
        plan = self.manager.prepare_store(keys, first_chunk=first_chunk, parent=parent, **retention)
        if plan is None or not plan.keys:
            return
        index = {key: i for i, key in enumerate(keys)}
        job_id = self.transfer.submit_store(
            _rows(chunks, [index[k] for k in plan.keys]), plan.slots
        )
        self._stores[job_id] = plan.keys
        self.finish()

    # -- copies that land later --------------------------------------------------------------
    def finish(self) -> None:
        """Hand the copies that landed to the manager: stores, and loads that were late. Any
        job the engine no longer tracks has landed, however it was handed out (an earlier call
        interrupted between the engine's hand-out and ``_finished`` left it here)."""
        self.transfer.poll()
        for job_id in [*self._stores, *self._late_loads]:
            if not self.transfer.tracks(job_id):
                self._finished(job_id)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every copy to land (stores, late loads) and hand it to the manager."""
        for job_id in [*self._stores, *self._late_loads]:
            if self.transfer.tracks(job_id):  # else handed out already (see finish)
                self.transfer.wait(job_id, timeout)
            self._finished(job_id)

    def _finished(self, job_id: int) -> None:
        if job_id in self._late_loads:
            self.manager.complete_load(self._late_loads.pop(job_id)[0])  # its slots may go now
        else:
            self.manager.complete_store(self._stores.pop(job_id), success=True)


def _rows(chunks: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``chunks[rows]``: a view where ``rows`` are consecutive (the usual case: the chunks not
    yet in host are the prompt's tail), else a copy."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return chunks[rows[0] : rows[0] + len(rows)]
    return chunks.index_select(0, torch.tensor(rows, device=chunks.device))
