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

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.layout import KVLayout
from kvtier.model_fingerprint import fingerprint_model

OFFLOAD_KEY_BYTES = 36
#: Offload keys remembered for turning tier removals back into vLLM keys.
REVERSE_CAPACITY = 1 << 16


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


def byte_layout(
    bytes_per_block: int, tokens_per_block: int, blocks_per_chunk: int, num_layers: int
) -> KVLayout:
    """A kvtier layout whose ``chunk_bytes`` is vLLM's chunk (uint8 "heads" of the right size).

    kvtier sizes host slots from the layout, so a kvtier instance built with this identity (a
    peer server, say) has slots exactly as long as vLLM's rows. When the bytes do not split
    into K and V per token and layer, coarser shapes of the same size are used.
    """
    for layers, tokens in ((num_layers, tokens_per_block), (1, tokens_per_block), (1, 1)):
        if bytes_per_block > 0 and bytes_per_block % (2 * layers * tokens) == 0:
            head_dim = bytes_per_block // (2 * layers * tokens)
            return KVLayout(layers, 1, head_dim, "uint8", tokens, blocks_per_chunk)
    return KVLayout(max(1, num_layers), 1, 1, "uint8", tokens_per_block, blocks_per_chunk)


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


class KeyMap:
    """vLLM offload keys to kvtier chunk keys (and recent ones back); see the module docstring."""

    def __init__(self, identity: CacheIdentity, remember: int = REVERSE_CAPACITY) -> None:
        self._seed = identity.digest
        self._back: OrderedDict[ChunkKey, bytes] = OrderedDict()
        self._remember = remember

    def chunk_key(self, offload_key: bytes) -> ChunkKey:
        key = ChunkKey(hashlib.sha256(self._seed + bytes(offload_key)).digest())
        if not self._remember:
            return key
        self._back[key] = bytes(offload_key)
        self._back.move_to_end(key)
        if len(self._back) > self._remember:
            self._back.popitem(last=False)
        return key

    def chunk_keys(self, offload_keys: Iterable[bytes]) -> list[ChunkKey]:
        return [self.chunk_key(k) for k in offload_keys]

    def offload_key(self, key: ChunkKey) -> bytes | None:
        """The offload key ``key`` was made from, if it is still remembered."""
        return self._back.get(key)
