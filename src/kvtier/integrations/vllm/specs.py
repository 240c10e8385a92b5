"""vLLM offloading specs that work on vLLM's CPU platform: vLLM's own, with ``CPUHostWorker``.

* ``CPUTieringOffloadingSpec``: vLLM's ``TieringOffloadingSpec`` (host memory plus
  ``secondary_tiers``); its worker copies between the engine's KV tensors and the shared
  ``/dev/shm/vllm_offload_<engine_id>.mmap`` region that the secondary tiers read and write.
* ``CPUHostOffloadingSpec``: vLLM's ``CPUOffloadingSpec`` (host memory only); its worker keeps
  the host copies in private tensors of the worker process.

Load them with ``"spec_name": "<class>", "spec_module_path": "kvtier.integrations.vllm"``. The
host-only spec is not called ``CPUOffloadingSpec``: vLLM looks ``spec_name`` up in its own
registry first, where that name (and ``TieringOffloadingSpec``) is vLLM's CUDA spec, so a class
of ours by that name would never be loaded. On CUDA, use vLLM's stock specs.

Only ``get_worker`` differs from vLLM's specs; it runs in the worker process.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvtier.integrations.vllm.worker import CPUHostWorker


def _refuse_canonical(config: Any) -> None:
    if getattr(config, "canonical_layout", False):
        raise RuntimeError(
            "canonical_layout is not supported by kvtier's CPU worker; remove it from "
            "kv_connector_extra_config"
        )


class CPUTieringOffloadingSpec(TieringOffloadingSpec):
    """vLLM's tiering spec with a worker for the CPU platform (see the module docstring)."""

    _worker: Any

    def get_worker(self, kv_caches: Any) -> Any:
        if not self._worker:
            _refuse_canonical(self.config)
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            region = SharedOffloadRegion(
                engine_id=self.config.engine_id,
                num_chunks=self.num_chunks,
                rank=rank,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )
            try:
                worker = CPUHostWorker(
                    kv_caches, self.blocks_per_chunk, region.create_next_worker_view, region.cleanup
                )
            except BaseException:
                region.cleanup()
                raise
            self._worker = worker
        return self._worker


class CPUHostOffloadingSpec(CPUOffloadingSpec):
    """vLLM's host-memory-only spec with a worker for the CPU platform (module docstring)."""

    _worker: Any

    def get_worker(self, kv_caches: Any) -> Any:
        if not self._worker:
            _refuse_canonical(self.config)
            num_chunks = self.num_chunks

            def host_tensor(page_bytes: int) -> torch.Tensor:
                return torch.zeros((num_chunks, page_bytes), dtype=torch.int8)

            self._worker = CPUHostWorker(kv_caches, self.blocks_per_chunk, host_tensor)
        return self._worker
