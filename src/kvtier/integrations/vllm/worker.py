"""A KV transfer worker for vLLM's CPU platform: pages copied between engine tensors and host rows.

vLLM's own offloading worker needs CUDA streams, events and a swap kernel. On the CPU platform
the engine's KV cache is host memory already, so a transfer is a plain memory move:
``CPUHostWorker`` copies each page between the engine's block tensors and the host rows (the
shared ``/dev/shm`` region of the tiering spec, or private tensors for a host-only spec).
Addresses come from vLLM's descriptor helper (``compute_sub_block_ptrs``): one page per
(block, layer tensor), a host chunk holding ``blocks_per_chunk`` pages of each tensor.

Copies run synchronously on the worker's thread inside ``submit_store`` / ``submit_load``; on
CPU the model's forward has finished writing the pages a store reads (vLLM submits stores at
the start of the next step) and a load lands before the step's forward, so ``wait`` has
nothing to wait for. Results are handed out by the next ``get_finished``.

Direct (per-worker) host layout only: the canonical layout is refused at start.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from vllm.v1.kv_offload.base import GPULoadStoreSpec, OffloadingWorker, TransferResult
from vllm.v1.kv_offload.cpu.gpu_worker import compute_sub_block_ptrs

#: Makes the host tensor of one engine tensor: (host page bytes) -> (num_chunks, page) int8.
HostTensorFactory = Callable[[int], torch.Tensor]


class _Copier:
    """Copies blocks in one direction between engine tensors and host tensors."""

    def __init__(
        self, engine: list[torch.Tensor], host: list[torch.Tensor], refs: Any, to_host: bool
    ) -> None:
        self._src, self._dst = (engine, host) if to_host else (host, engine)
        self._refs: Sequence[Sequence[Any]] = refs
        self._to_host = to_host

    def copy(self, src_spec: Any, dst_spec: Any, blocks_per_chunk: int) -> int:
        """Copy every page of the job; returns the bytes moved."""
        engine_spec = src_spec if self._to_host else dst_spec
        assert isinstance(engine_spec, GPULoadStoreSpec)
        per_src = 1 if self._to_host else blocks_per_chunk
        per_dst = blocks_per_chunk if self._to_host else 1
        src_at, dst_at, moved = 0, 0, 0
        groups = zip(engine_spec.group_sizes, engine_spec.block_indices, self._refs, strict=True)
        for size, first_index, refs in groups:
            if size == 0:
                continue
            src_skip, dst_skip = first_index % per_src, first_index % per_dst
            n_src, n_dst = -(-(size + src_skip) // per_src), -(-(size + dst_skip) // per_dst)
            src_ids = src_spec.block_ids[src_at : src_at + n_src]
            dst_ids = dst_spec.block_ids[dst_at : dst_at + n_dst]
            for ref in refs:
                moved += self._copy_pages(
                    ref, size, (src_ids, per_src, src_skip), (dst_ids, per_dst, dst_skip)
                )
            src_at, dst_at = src_at + n_src, dst_at + n_dst
        return moved

    def _copy_pages(
        self, ref: Any, count: int, src: tuple[Any, int, int], dst: tuple[Any, int, int]
    ) -> int:
        src_ptrs = self._pointers(self._src[ref.tensor_idx], count, *src)
        dst_ptrs = self._pointers(self._dst[ref.tensor_idx], count, *dst)
        size = int(ref.page_size_bytes)
        for s, d in zip(src_ptrs.tolist(), dst_ptrs.tolist(), strict=True):
            ctypes.memmove(d, s, size)
        return count * size

    @staticmethod
    def _pointers(tensor: torch.Tensor, count: int, ids: Any, per: int, skip: int) -> Any:
        out = np.empty(count, dtype=np.uint64)
        compute_sub_block_ptrs(ids, per, out, tensor, skip_count=skip)
        return out


class CPUHostWorker(OffloadingWorker):
    """vLLM ``OffloadingWorker`` for the CPU platform (see the module docstring).

    ``host_tensor(page_bytes)`` gives the host tensor of each engine tensor in turn;
    ``on_shutdown`` releases what backs them (the shared region's cleanup).
    """

    def __init__(
        self,
        kv_caches: Any,
        blocks_per_chunk: int,
        host_tensor: HostTensorFactory,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        engine, host = [], []
        for cache in kv_caches.tensors:
            page = int(cache.page_size_bytes)
            engine.append(cache.tensor.view(torch.int8).view(-1, page))
            host.append(host_tensor(page * blocks_per_chunk))
        refs = kv_caches.group_data_refs
        self._store = _Copier(engine, host, refs, to_host=True)
        self._load = _Copier(engine, host, refs, to_host=False)
        self._blocks_per_chunk = blocks_per_chunk
        self._finished: list[TransferResult] = []
        self._on_shutdown = on_shutdown

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        return self._run(job_id, self._store, src_spec, dst_spec)

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        return self._run(job_id, self._load, src_spec, dst_spec)

    def _run(self, job_id: int, copier: _Copier, src_spec: Any, dst_spec: Any) -> bool:
        start = time.perf_counter()
        moved = copier.copy(src_spec, dst_spec, self._blocks_per_chunk)
        elapsed = time.perf_counter() - start
        self._finished.append(TransferResult(job_id, True, moved, elapsed))
        return True

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        """Nothing to wait for: every copy finished inside its submit call."""

    def shutdown(self) -> None:
        """Drop every view of the host memory, then release it (the region's cleanup)."""
        self._store = self._load = _Copier([], [], [], to_host=True)
        if self._on_shutdown is not None:
            self._on_shutdown()
            self._on_shutdown = None
