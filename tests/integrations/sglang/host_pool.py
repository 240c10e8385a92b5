"""A host pool shaped like SGLang's MHA host pool, for the backend's tests without SGLang.

``MhaHostPool`` lays out its buffer as SGLang 0.5.23's ``MHATokenToKVPoolHost`` does
(``kv_buffer[2, tokens, layers, heads, dim]`` for ``page_first``; ``[2, layers, tokens,
heads, dim]`` for ``layer_first``) and answers ``get_page_buffer_meta`` with the same pointer
arithmetic, so kvtier reads and writes it exactly as it would SGLang's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch


class MhaHostPool:
    def __init__(
        self, pages: int = 64, page_size: int = 4, layers: int = 2, heads: int = 2, dim: int = 8,
        dtype: torch.dtype = torch.float32, layout: str = "page_first",
    ) -> None:  # fmt: skip
        self.page_size, self.layer_num, self.head_num, self.head_dim = page_size, layers, heads, dim
        self.size, self.dtype, self.layout = pages * page_size, dtype, layout
        self.storage_format_tag = None
        shape = (
            (2, self.size, layers, heads, dim)
            if layout == "page_first"
            else (2, layers, self.size, heads, dim)
        )
        self.kv_buffer = torch.zeros(shape, dtype=dtype)

    def get_page_buffer_meta(self, indices: Any) -> tuple[list[int], list[int]]:
        assert len(indices) % self.page_size == 0
        item, base = self.dtype.itemsize, self.kv_buffer.data_ptr()
        v_offset = self.layer_num * self.size * self.head_num * self.head_dim * item
        pointers: list[int] = []
        indices = indices.tolist()
        for first in indices[:: self.page_size]:
            if self.layout == "page_first":
                k = base + first * self.layer_num * self.head_num * self.head_dim * item
                pointers += [k, k + v_offset]
                size = self.layer_num * item * self.page_size * self.head_num * self.head_dim
            else:
                for layer in range(self.layer_num):
                    k = base + (first + layer * self.size) * self.head_num * self.head_dim * item
                    pointers += [k, k + v_offset]
                size = item * self.page_size * self.head_num * self.head_dim
        return pointers, [size] * len(pointers)

    def page_indices(self, pages: list[int]) -> torch.Tensor:
        return torch.tensor([p * self.page_size + t for p in pages for t in range(self.page_size)])

    def page(self, page: int) -> torch.Tensor:
        """A copy of the page's K and V (for comparisons)."""
        tokens = slice(page * self.page_size, (page + 1) * self.page_size)
        if self.layout == "page_first":
            return self.kv_buffer[:, tokens].clone()
        return self.kv_buffer[:, :, tokens].clone()

    def fill(self, page: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        tokens = slice(page * self.page_size, (page + 1) * self.page_size)
        view = (
            self.kv_buffer[:, tokens]
            if self.layout == "page_first"
            else self.kv_buffer[:, :, tokens]
        )
        view.copy_(torch.randn(view.shape, generator=generator).to(self.dtype))

    def flat_page(self, page: int) -> torch.Tensor:
        """SGLang's ``get_data_page(flat=True)`` for page_first: K page then V page."""
        tokens = slice(page * self.page_size, (page + 1) * self.page_size)
        return self.kv_buffer[:, tokens].flatten().clone()


@dataclass
class StorageConfig:
    """SGLang's ``HiCacheStorageConfig`` fields the backend reads."""

    extra_config: dict[str, Any] = field(default_factory=dict)
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    is_mla_model: bool = False
    model_name: str = "test-org/test-model"
    dp_rank: int = 0
    dcp_size: int = 1
    dcp_rank: int = 0


def extra(root: str, **kvtier: Any) -> dict[str, Any]:
    tiers = kvtier.pop("secondary_tiers", [{"type": "fs", "root_dir": root}])
    return {"backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
            "class_name": "KvtierHiCacheStorage", "interface_v1": 1,
            "kvtier": {"secondary_tiers": tiers, **kvtier}}  # fmt: skip


def page_keys(n: int, salt: str = "") -> list[str]:
    import hashlib

    return [hashlib.sha256(f"{salt}page{i}".encode()).hexdigest() for i in range(n)]


__all__ = ["MhaHostPool", "SimpleNamespace", "StorageConfig", "extra", "page_keys"]
