"""Which SGLang caches may share pages, and the kvtier chunk key of each page span.

``identity_for`` derives kvtier's ``CacheIdentity`` from SGLang's ``HiCacheStorageConfig`` and
its host pool: the model (a local directory by its content fingerprint, see
``kvtier.model_fingerprint``, else SGLang's model name), the revision (kvtier's ``revision`` key
and SGLang's ``--revision``), the logical KV dtype, tokens per page, the host pool's class,
layout and page format tag, the span shape of a page, whether pages move zero-copy
(``interface_v1``) or through SGLang's flat copies, and the parallel coordinates that decide a
rank's bytes: TP rank and size (not for MLA, whose KV every TP rank holds whole), PP and
attention-CP rank and size, DCP. The DP rank is left out on purpose: DP replicas hold the same
bytes and share.

cache_salt and extra_key need nothing here: SGLang seeds its page hashes with them
(storage_namespace_seed), so salted pages already have other keys.

``span_key`` names span ``i`` of the page whose SGLang key (64 hex digits) is ``page_key``; a
``KeyMap`` turns it into the chunk key ``sha256(identity digest || span key)``, and remembers it
the other way for removal events. ``page_hash`` is SGLang's own block hash of a page for KV
events (hash_str_to_int64: the first 16 hex digits as a signed int64), so routers can join
kvtier's L3 events with SGLang's GPU and CPU ones.

Nothing here imports SGLang (the config and pool are read by attribute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtier.identity import CacheIdentity
from kvtier.integrations.common.byte_layout import byte_layout
from kvtier.model_fingerprint import fingerprint_model


@dataclass(frozen=True)
class PoolShape:
    """How SGLang's host pool lays out one page: ``spans`` spans of ``span_bytes`` each."""

    page_size: int
    spans: int
    span_bytes: int

    @property
    def page_bytes(self) -> int:
        return self.spans * self.span_bytes


def pool_shape(pool: Any) -> PoolShape:
    """The span shape of ``pool``'s pages, from ``get_page_buffer_meta`` of its first page
    (no I/O: pointer arithmetic on the pool's buffers)."""
    import torch

    page_size = int(pool.page_size)
    pointers, sizes = pool.get_page_buffer_meta(torch.arange(page_size, dtype=torch.int64))
    if not pointers or len(set(sizes)) != 1:
        raise ValueError(f"host pool pages of unequal spans: {list(sizes)}")
    return PoolShape(page_size, len(pointers), int(sizes[0]))


def parallel_coordinates(config: Any) -> str:
    """The parallel coordinates that decide a rank's bytes (never the DP rank)."""
    parts = [] if config.is_mla_model else [f"tp={config.tp_rank}/{config.tp_size}"]
    parts += [f"pp={config.pp_rank}/{config.pp_size}"]
    parts += [f"cp={config.attn_cp_rank}/{config.attn_cp_size}"]
    dcp_size = int(getattr(config, "dcp_size", 1) or 1)
    if dcp_size > 1:
        parts.append(f"dcp={config.dcp_rank}/{dcp_size}")
    return ",".join(parts)


def identity_for(
    config: Any,
    pool: Any,
    shape: PoolShape,
    *,
    revision: str = "",
    model_path: str | None = None,
    zero_copy: bool = True,
) -> CacheIdentity:
    """kvtier's identity of the pages of ``config``'s rank over ``pool`` (module docstring).

    ``model_path`` (SGLang's ``--model-path``) is fingerprinted when it is local; otherwise
    SGLang's model name decides. ``ConfigError`` when a local model cannot be fingerprinted.
    """
    layers = int(getattr(pool, "layer_num", 1) or 1)
    layout = byte_layout(shape.span_bytes, shape.page_size, 1, layers)
    extra = {
        "engine": "sglang",
        "kv_dtype": str(pool.dtype).removeprefix("torch."),
        "page_size": str(shape.page_size),
        "host_pool": type(pool).__name__,
        "host_layout": str(pool.layout),
        "page_format": str(getattr(pool, "storage_format_tag", None)),
        "spans": f"{shape.spans}x{shape.span_bytes}",
        "parallel": parallel_coordinates(config),
        "interface": "v1" if zero_copy else "generic",
    }
    name = str(model_path or config.model_name or "")
    found = fingerprint_model(name) if model_path else None
    if found is None:
        return CacheIdentity(model=name, layout=layout, revision=revision, extra=extra)
    return CacheIdentity(
        model=found.name, layout=layout, revision=revision, extra=extra, fingerprint=found.digest
    )


def span_key(page_key: str, span: int) -> bytes:
    """The engine key of span ``span`` of SGLang's page ``page_key``."""
    return page_key.encode() + b"/" + str(span).encode()


def page_of(span_key_bytes: bytes) -> str:
    """The SGLang page key a ``span_key`` was made from."""
    return span_key_bytes.rsplit(b"/", 1)[0].decode()


def page_hash(page_key: str) -> int:
    """SGLang's block hash of a page in KV events: the first 16 hex digits, signed int64."""
    value = int(page_key[:16], 16)
    return value - (1 << 64) if value >= 1 << 63 else value
