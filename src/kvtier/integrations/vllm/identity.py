"""Which vLLM caches may share chunks, and the kvtier key of each vLLM offload key.

``identity_from_config(spec.config)`` derives kvtier's ``CacheIdentity`` from vLLM's normalized
``OffloadingConfig``: the model (a local model directory by its content fingerprint, see
``kvtier.model_fingerprint``, so the same weights under two paths share chunks; a hub id by its
name and ``revision``), the KV dtype, every KV group (tokens per block and its
layer names), blocks per chunk and tokens per hash, the bytes one worker keeps per block, the
parallel layout (or ``agnostic`` when vLLM says the bytes do not depend on it), the canonical
layout flag and the KV cache layout name. Two engines of the same model and layout get the same
identity, so they read each other's chunks; any difference gives another identity digest, which
seeds every key and names every tier namespace, so their chunks never mix.

``KeyMap`` turns vLLM's ``OffloadKey`` (32-byte block hash + 4-byte big-endian KV group index)
into a kvtier ``ChunkKey`` deterministically: ``sha256(identity digest || offload key)``. The
same offload key under the same identity is the same chunk on every process and machine. It
remembers the last ``remember`` keys the other way (none when vLLM publishes no KV events), so
removals reported by a tier become vLLM keys again.

Only duck-typed attribute reads of the config: nothing here imports vLLM.
Thread safety: ``KeyMap`` is used by the scheduler thread only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvtier.identity import CacheIdentity
from kvtier.integrations.common.byte_layout import byte_layout
from kvtier.integrations.common.keymap import REVERSE_CAPACITY, KeyMap
from kvtier.layout import KVLayout
from kvtier.model_fingerprint import fingerprint_model

OFFLOAD_KEY_BYTES = 36

__all__ = ["REVERSE_CAPACITY", "KeyMap", "byte_layout", "identity_from_config"]


def parallel_layout(parallel: Any) -> str:
    """The part of vLLM's parallel config that decides the bytes of a chunk row."""
    if getattr(parallel, "is_parallelism_agnostic", False):
        return "agnostic"
    sizes = ("world_size", "tp_size", "pp_size", "pcp_size", "dcp_size")
    return ",".join(f"{name}={getattr(parallel, name, 1)}" for name in sizes)


def _groups(config: Any) -> list[dict[str, Any]]:
    return [
        {"tokens_per_block": g.tokens_per_block, "layers": list(g.layer_names)}
        for g in config.groups
    ]


def row_bytes_per_block(config: Any) -> int:
    """Bytes one block takes in a chunk row of the host region (every worker's share)."""
    copies = 1 if getattr(config, "replicated_layout", False) else config.parallel.world_size
    return int(config.worker_kv_bytes_per_block) * max(1, int(copies))


def identity_from_config(config: Any, revision: str = "") -> CacheIdentity:
    """kvtier's identity of the chunks an engine with vLLM ``OffloadingConfig`` ``config`` makes.

    ``config.model.name`` (vLLM's ``--model``) that is a local path is fingerprinted: the
    identity's ``model`` is then its display name and its ``fingerprint`` decides. Raises
    ``ConfigError`` when that local model cannot be fingerprinted (``fingerprint_model``).
    """
    groups = _groups(config)
    num_layers = max(1, sum(len(g["layers"]) for g in groups))
    tokens_per_block = max(1, groups[0]["tokens_per_block"] if groups else 1)
    blocks_per_chunk = max(1, int(config.cache.blocks_per_chunk))
    layout = byte_layout(
        row_bytes_per_block(config), tokens_per_block, blocks_per_chunk, num_layers
    )
    extra = {
        "engine": "vllm",
        "kv_dtype": str(config.model.dtype).removeprefix("torch."),
        "groups": json.dumps(groups, separators=(",", ":")),
        "tokens_per_hash": str(config.cache.tokens_per_hash),
        "parallel": parallel_layout(config.parallel),
        "canonical_layout": _flag(getattr(config, "canonical_layout", False)),
        "replicated_layout": _flag(getattr(config, "replicated_layout", False)),
        "kv_cache_layout": str(getattr(config, "kv_cache_layout", None)),
    }
    name = str(config.model.name)
    found = fingerprint_model(name)
    if found is None:
        return CacheIdentity(model=name, layout=layout, revision=revision, extra=extra)
    return CacheIdentity(
        model=found.name, layout=layout, revision=revision, extra=extra, fingerprint=found.digest
    )


def _flag(value: object) -> str:
    return "true" if value else "false"


def identity_from_description(description: Mapping[str, Any]) -> CacheIdentity:
    """The identity whose ``describe()`` is ``description`` (as in a tier's identity.json).

    For identities made by ``identity_from_config`` (their layouts have no layer groups).
    """
    fields = dict(description["layout"])
    fields.pop("layout_version", None)
    fields.pop("groups", None)
    return CacheIdentity(
        model=description["model"],
        layout=KVLayout(**fields),
        revision=description.get("revision", ""),
        extra=dict(description.get("extra", {})),
        fingerprint=description.get("fingerprint", ""),
    )
