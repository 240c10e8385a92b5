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

``get_worker`` (worker process) differs from vLLM's specs, and so does the tiering spec's
``get_manager`` (engine-core process, scheduler thread), for host-memory hygiene (``shm``): at
start, regions of ``/dev/shm`` left by dead engines of kvtier's specs are removed (both specs,
before any host memory is allocated); the tiering spec's region is marked and locked by every
process that opens it, and its name is removed once all of them have mapped it, so no stop,
SIGKILL included, leaves it behind.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvtier.integrations.vllm import shm
from kvtier.integrations.vllm.engine_config import refuse_orphan_runtime_keys
from kvtier.integrations.vllm.worker import CPUHostWorker
from kvtier.telemetry.logs import log_to_stderr


def _refuse_canonical(config: Any) -> None:
    if getattr(config, "canonical_layout", False):
        raise RuntimeError(
            "canonical_layout is not supported by kvtier's CPU worker; remove it from "
            "kv_connector_extra_config"
        )


class _RegionOwner:
    """A worker's hold on the shared region: ``close`` (at worker shutdown) releases both."""

    def __init__(self, region: SharedOffloadRegion, claim: shm.Claim) -> None:
        self.region, self.claim = region, claim

    def close(self) -> None:
        """Unmap the region, then drop the marker's lock (``shm.Claim.release``).

        vLLM's cleanup unlinks the name if this worker created the file; once the scheduler
        has removed the name (the usual case) that would fail with a traceback in the log, or
        remove another engine's file of the same name: it is told it no longer owns the name.
        """
        fd = getattr(self.region, "fd", None)
        if fd is not None and not shm.names_file(self.region.mmap_path, fd):
            self.region._creator = False
        self.region.cleanup()
        self.claim.release()


class CPUTieringOffloadingSpec(TieringOffloadingSpec):
    """vLLM's tiering spec with a worker for the CPU platform (see the module docstring)."""

    _worker: Any
    _shm_claim: shm.Claim | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        log_to_stderr()
        refuse_orphan_runtime_keys(self.extra_config, tiers_run=True)

    def get_worker(self, kv_caches: Any) -> Any:
        """Worker process: sweep dead regions, claim ours, then create or join it."""
        if not self._worker:
            _refuse_canonical(self.config)
            removed = shm.sweep()
            claim = shm.Claim.acquire(shm.region_path(self.config.engine_id))
            claim.report(removed)
            try:
                owner = _RegionOwner(self._open_region(), claim)
            except BaseException:
                claim.release()
                raise
            try:
                worker = CPUHostWorker(
                    kv_caches,
                    self.blocks_per_chunk,
                    owner.region.create_next_worker_view,
                    owner.close,
                )
            except BaseException:
                owner.close()
                raise
            self._worker = worker
        return self._worker

    def _open_region(self) -> SharedOffloadRegion:
        rank = 0 if self.replicated_layout else self.config.parallel.rank
        return SharedOffloadRegion(
            engine_id=self.config.engine_id,
            num_chunks=self.num_chunks,
            rank=rank,
            kv_bytes_per_chunk=self.kv_bytes_per_chunk,
            cpu_page_size=self.cpu_page_size_per_worker,
        )

    def get_manager(self) -> Any:
        """Engine-core process, scheduler thread: vLLM's manager, opening the region last.

        Every worker has mapped the region by now (vLLM builds the scheduler after the workers
        registered their KV caches), so when the scheduler joined a file a worker created, its
        name is removed (``shm.Claim.forget_name``): the kernel frees the memory with the
        engine's last process. If the scheduler created the file, the name stays (and the
        claim is held) until vLLM's cleanup removes it.
        """
        if self._manager:
            return self._manager
        claim = shm.Claim.acquire(shm.region_path(self.config.engine_id))
        claim.take_reports()
        try:
            manager = super().get_manager()
        except BaseException:
            claim.release()
            raise
        if self._forget_region_name(claim):
            claim.release()  # nothing left to guard: no name, no marker
        else:
            self._shm_claim = claim  # guards the named region for this process's life
        return manager

    def _forget_region_name(self, claim: shm.Claim) -> bool:
        """Remove the region's name if the scheduler joined a file a worker had created."""
        region = getattr(self, "_scheduler_mmap", None)
        fd = getattr(region, "fd", None)
        joined = region is not None and getattr(region, "_creator", True) is False
        return joined and fd is not None and claim.forget_name(fd)


class CPUHostOffloadingSpec(CPUOffloadingSpec):
    """vLLM's host-memory-only spec with a worker for the CPU platform (module docstring)."""

    _worker: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        log_to_stderr()
        refuse_orphan_runtime_keys(self.extra_config, tiers_run=False)

    def get_worker(self, kv_caches: Any) -> Any:
        """Worker process: sweep dead regions of kvtier's specs, then private host tensors."""
        if not self._worker:
            _refuse_canonical(self.config)
            shm.sweep()
            num_chunks = self.num_chunks

            def host_tensor(page_bytes: int) -> torch.Tensor:
                return torch.zeros((num_chunks, page_bytes), dtype=torch.int8)

            self._worker = CPUHostWorker(kv_caches, self.blocks_per_chunk, host_tensor)
        return self._worker
