"""TEST-ONLY SGLang plugin: HiCache's host pool (L2) on the CPU engine; see README.md here.

Registered through ``kvtier_sglang_cpu_testshim-0.1.0.dist-info/entry_points.txt`` (group
``sglang.srt.plugins``); SGLang calls ``register()`` in each process at start.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

_MHA = "sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost."


def _host_rows(pool: Any, host: torch.Tensor, layer_id: int) -> tuple[Any, ...]:
    """The index into the host buffer of ``host`` token slots of layer ``layer_id``."""
    if pool.layout == "layer_first":  # [layer, token, head, dim]
        return (layer_id, host)
    if pool.layout == "page_first":  # [token, layer, head, dim]
        return (host, layer_id)
    if pool.layout == "page_first_direct":  # [page, layer, token in page, head, dim]
        page, offset = host // pool.page_size, host % pool.page_size
        return (page, layer_id, offset)
    raise ValueError(f"kvtier test shim: host layout {pool.layout} is not supported")


def load_to_device_per_layer(
    self: Any, device_pool: Any, host_indices: Any, device_indices: Any, layer_id: int,
    io_backend: Any, *, is_draft: bool = False,
) -> None:  # fmt: skip
    """Host -> device for one layer, with torch indexing instead of SGLang's kernels."""
    if not is_draft and not 0 <= layer_id < self.target_layer_num:
        return
    rows = _host_rows(self, host_indices.long(), layer_id)
    device = device_indices.long()
    self.device_k_buffers[layer_id][device] = self.k_buffer[rows].to(self.device_k_buffers[0].dtype)
    self.device_v_buffers[layer_id][device] = self.v_buffer[rows].to(self.device_v_buffers[0].dtype)


def backup_from_device_all_layer(
    self: Any, device_pool: Any, host_indices: Any, device_indices: Any, io_backend: Any
) -> None:
    """Device -> host for every layer, with torch indexing instead of SGLang's kernels."""
    host, device = host_indices.long(), device_indices.long()
    for layer_id, (k, v) in enumerate(zip(self.device_k_buffers, self.device_v_buffers)):
        rows = _host_rows(self, host, layer_id)
        self.k_buffer[rows] = k[device].to(self.k_buffer.dtype)
        self.v_buffer[rows] = v[device].to(self.v_buffer.dtype)


def allocate_plain(
    dims: Any, dtype: Any, device: Any, pin_memory: Any, allocator: Any,
    registration_granularity_bytes: Any = None,
) -> torch.Tensor:  # fmt: skip
    """The host pool's buffer as ordinary memory (no cudaHostRegister on a CPU machine)."""
    if allocator is not None and hasattr(allocator, "allocate"):
        return allocator.allocate(dims, dtype=dtype, device=device)
    return torch.empty(dims, dtype=dtype, device=device)


def without_pinned_memory(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Before ``HostKVCache.__init__``: a CPU-only torch cannot pin memory."""
    if "pin_memory" in kwargs:
        kwargs["pin_memory"] = False
    return args, kwargs


def register() -> None:
    from sglang.srt.mem_cache.pool_host import common
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    common.ALLOC_MEMORY_FUNCS["cpu"] = allocate_plain
    replace = HookType.REPLACE
    HookRegistry.register(_MHA + "load_to_device_per_layer", load_to_device_per_layer, replace)
    HookRegistry.register(
        _MHA + "backup_from_device_all_layer", backup_from_device_all_layer, replace
    )
    HookRegistry.register(
        "sglang.srt.mem_cache.pool_host.base.HostKVCache.__init__",
        without_pinned_memory,
        HookType.BEFORE,
    )
    sys.stderr.write("[kvtier test shim] SGLang HiCache host pool on CPU\n")
