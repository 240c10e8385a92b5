"""KVLayout: how one chunk of KV cache is laid out in a host slot.

A chunk is ``blocks_per_chunk`` engine blocks of ``block_size`` tokens, for every layer. In the
slot, layers come in layer order; within a layer, one *page* per block. A page holds one block of
one layer with **all** KV heads in head order, K first then V::

    page = K[head][token][dim] ++ V[head][token][dim]

so the bytes of a chunk do not depend on how an engine shards heads across tensor-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtier.errors import ConfigError

#: Bumped whenever the canonical byte order of a slot changes; part of the cache identity.
LAYOUT_VERSION = 1

DTYPE_SIZES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}


@dataclass(frozen=True)
class KVLayout:
    """Shape of the KV cache of a full-attention model, and the byte offsets inside a chunk."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    block_size: int = 16
    blocks_per_chunk: int = 16

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size", "blocks_per_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"KVLayout.{name}: expected a positive integer, got {value!r}")
        if self.dtype not in DTYPE_SIZES:
            known = ", ".join(sorted(DTYPE_SIZES))
            raise ConfigError(f"KVLayout.dtype: expected one of {known}, got {self.dtype!r}")

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @property
    def tokens_per_chunk(self) -> int:
        return self.block_size * self.blocks_per_chunk

    @property
    def head_bytes(self) -> int:
        """Bytes of one head's K (or V) for one block: ``block_size * head_dim`` elements."""
        return self.block_size * self.head_dim * self.itemsize

    @property
    def page_bytes(self) -> int:
        """Bytes of one block of one layer: K and V of every head."""
        return 2 * self.num_kv_heads * self.head_bytes

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one chunk, which is the size of one host slot."""
        return self.num_layers * self.blocks_per_chunk * self.page_bytes

    def page_offset(self, layer: int, block: int) -> int:
        """Byte offset of the page of (``layer``, ``block`` within the chunk) inside the slot."""
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} out of range [0, {self.num_layers})")
        if not 0 <= block < self.blocks_per_chunk:
            raise IndexError(f"block {block} out of range [0, {self.blocks_per_chunk})")
        return (layer * self.blocks_per_chunk + block) * self.page_bytes

    def describe(self) -> dict[str, Any]:
        """Everything that decides the bytes of a chunk, as plain JSON-able values."""
        return {
            "layout_version": LAYOUT_VERSION,
            "num_layers": self.num_layers,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "dtype": self.dtype,
            "block_size": self.block_size,
            "blocks_per_chunk": self.blocks_per_chunk,
        }
