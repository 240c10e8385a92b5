"""Between transformers' cache objects and kvtier chunks, for every layer type kvtier lays out.

``layout_for`` maps transformers' ``layer_types`` to ``KVLayout`` groups, with shapes taken from
the cache of a one-token forward:

* ``full_attention`` → ``full``; ``latent`` when the config has ``kv_lora_rank`` (DeepSeek
  MLA caches one compressed KV vector and one rotary key per token, shared by all heads);
* ``sliding_attention`` → ``sliding`` (window: the layer's ``sliding_window``);
* ``linear_attention`` (Mamba / Mamba2 mixers) → ``state``: the conv and recurrent states;
* ``hybrid`` (attention and a Mamba mixer in one layer, Falcon-H1) → ``full`` and ``state``.

Other types (chunked or indexed attention, sliding hybrids, layers without a cache) are refused.

``CacheSession`` is one request's cache. Sliding layers record their past (they keep every
token instead of the last ``window - 1``) so that every chunk of the sequence can be stored. A
model with state layers runs in pieces that end at chunk boundaries, and the state after each
boundary is kept for the chunk that ends there (a chunk-aligned prefill: transformers only
exposes the state after the last token it ran).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import (
    DynamicSlidingWindowLayer,
    LinearAttentionCacheLayerMixin,
    get_layer_types_and_kwargs,
)

from kvtier.device.pages import TORCH_DTYPES, LayerKV, pack_chunks, unpack_chunks, unpack_states
from kvtier.errors import ConfigError
from kvtier.layout import FULL, LATENT, SLIDING, STATE, KVLayout, LayerGroup

DTYPE_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}
KINDS = {
    "full_attention": (FULL,),
    "sliding_attention": (SLIDING,),
    "linear_attention": (STATE,),
    "hybrid": (FULL, STATE),
}


@dataclass(frozen=True)
class StateMember:
    """One state tensor of a state layer: ``cache.layers[i].<attr>[index]``, batch dim dropped."""

    attr: str  # "conv_states" or "recurrent_states"
    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class Probe:
    """What a one-token forward's cache shows: per-layer KV shapes and state members."""

    kv: dict[int, tuple[tuple[int, ...], ...]]  # layer -> shape of each cached tensor, [H, D]
    states: dict[int, tuple[StateMember, ...]]


def layer_types(model: Any) -> list[tuple[str, int]]:
    """transformers' cache layer type of every decoder layer, with its sliding window (or 0)."""
    types, kwargs = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
    unsupported = sorted(set(types) - set(KINDS))
    if unsupported:
        raise ConfigError(
            f"layer_types: {unsupported} are not supported (supported: {sorted(KINDS)})"
        )
    return [(kind, kw.get("sliding_window") or 0) for kind, kw in zip(types, kwargs, strict=True)]


@torch.inference_mode()
def probe(model: Any) -> Probe:
    """Run one token through ``model`` and read the shapes its cache holds."""
    cache: Any = DynamicCache(config=model.config)
    ids = torch.zeros((1, 1), dtype=torch.long, device=model.device)
    model(input_ids=ids, cache=cache, use_cache=True)
    kv: dict[int, tuple[tuple[int, ...], ...]] = {}
    states: dict[int, tuple[StateMember, ...]] = {}
    for index, layer in enumerate(cache.layers):
        if getattr(layer, "keys", None) is not None:
            kv[index] = tuple((t.shape[1], t.shape[3]) for t in (layer.keys, layer.values))
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            states[index] = tuple(_members(layer))
    return Probe(kv, states)


def _members(layer: Any) -> list[StateMember]:
    members = []
    for index in range(layer.number_of_states):
        for attr in ("conv_states", "recurrent_states"):
            value = getattr(layer, attr)[index]
            if value is not None:
                members.append(StateMember(attr, index, tuple(value.shape[1:]), value.dtype))
    return members


def layout_for(model: Any, block_size: int = 16, blocks_per_chunk: int = 16) -> KVLayout:
    """The ``KVLayout`` of a causal LM's cache, in the model's dtype (module docstring)."""
    config = model.config.get_text_config(decoder=True)
    types, found = layer_types(model), probe(model)
    latent = getattr(config, "kv_lora_rank", None) is not None
    kinds = [tuple(LATENT if latent and k == FULL else k for k in KINDS[t]) for t, _ in types]
    groups = _groups(kinds, [window for _, window in types], found)
    heads, head_dim = _attention_shape(found, kinds)
    plain = all(kind == (FULL,) for kind in kinds)
    return KVLayout(
        num_layers=len(types),
        num_kv_heads=heads,
        head_dim=head_dim,
        dtype=DTYPE_NAMES[model.dtype],
        block_size=block_size,
        blocks_per_chunk=blocks_per_chunk,
        groups=() if plain else groups,
    )


def _groups(
    kinds: list[tuple[str, ...]], windows: list[int], found: Probe
) -> tuple[LayerGroup, ...]:
    def having(kind: str) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(kinds) if kind in k)

    groups = [LayerGroup(FULL, having(FULL))] if having(FULL) else []
    for window in sorted({windows[i] for i in having(SLIDING)}):
        layers = tuple(i for i in having(SLIDING) if windows[i] == window)
        groups.append(LayerGroup(SLIDING, layers, window=window))
    if having(LATENT):
        dims = tuple(dim for _, dim in found.kv[having(LATENT)[0]])
        groups.append(LayerGroup(LATENT, having(LATENT), latent_dims=dims))
    if having(STATE):
        groups.append(_state_group(having(STATE), found))
    return tuple(groups)


def _state_group(layers: tuple[int, ...], found: Probe) -> LayerGroup:
    members = {found.states[layer] for layer in layers}
    if len(members) != 1:
        raise ConfigError("layer_types: state layers with different state shapes")
    (first,) = members
    dtypes = {member.dtype for member in first}
    if len(dtypes) != 1:
        names = sorted(map(str, dtypes))
        raise ConfigError(f"layer_types: state tensors of several dtypes {names}")
    shapes = tuple(member.shape for member in first)
    return LayerGroup(STATE, layers, state_shapes=shapes, dtype=DTYPE_NAMES[dtypes.pop()])


def _attention_shape(found: Probe, kinds: list[tuple[str, ...]]) -> tuple[int, int]:
    """(KV heads, head dim) of the attention layers; (1, latent dim) for latent-only models."""
    shapes = {found.kv[i] for i, k in enumerate(kinds) if FULL in k or SLIDING in k}
    if len(shapes) > 1:
        raise ConfigError(f"attention layers of several shapes: {sorted(shapes)}")
    if shapes:
        (heads, head_dim), _ = shapes.pop()
        return heads, head_dim
    latent = [sum(d for _, d in found.kv[i]) for i, k in enumerate(kinds) if LATENT in k]
    return 1, latent[0] if latent else 1


class CacheSession:
    """One request's transformers cache: restored from chunks, run, and packed into chunks.

    ``chunks`` (``(N, *chunk_shape)``, or ``None``) are chunks ``first_chunk ..`` of the sequence
    and the model resumes after chunk ``first_chunk + N - 1``. ``members`` gives each state
    layer's state tensors (``probe(model).states``).
    """

    def __init__(
        self,
        model: Any,
        layout: KVLayout,
        members: dict[int, tuple[StateMember, ...]],
        chunks: torch.Tensor | None,
        first_chunk: int,
    ) -> None:
        self.model, self.layout, self.members = model, layout, members
        self.first_chunk = first_chunk
        loaded = 0 if chunks is None else chunks.shape[0]
        self.num_tokens = (first_chunk + loaded) * layout.tokens_per_chunk
        self.state_section = layout.section("state")
        self.boundary_states: dict[int, torch.Tensor] = {}  # chunk -> (state layers, elements)
        self.cache = self._build(chunks)

    def _build(self, chunks: torch.Tensor | None) -> Any:
        cache: Any = DynamicCache(config=self.model.config)
        for layer in cache.layers:
            if isinstance(layer, DynamicSlidingWindowLayer):
                layer.activate_past_recording()  # type: ignore[no-untyped-call]
        if chunks is None:
            return cache
        for index, kv in enumerate(unpack_chunks(chunks, self.layout)):
            if kv is not None:
                cache.layers[index].update(*kv)
            if isinstance(cache.layers[index], DynamicSlidingWindowLayer):
                cache.layers[index].cumulative_length = self.num_tokens
        states = unpack_states(chunks[-1:], self.layout)
        if states is not None:
            self._restore_states(cache, states[0])
        return cache

    def _restore_states(self, cache: Any, states: torch.Tensor) -> None:
        assert self.state_section is not None
        for row, index in enumerate(self.state_section.layers):
            layer, offset = cache.layers[index], 0
            for member in self.members[index]:
                size = math.prod(member.shape)
                value = states[row, offset : offset + size].view(1, *member.shape)
                offset += size
                layer.lazy_initialization(**{member.attr: value, "state_idx": member.index})
                getattr(layer, member.attr)[member.index].copy_(value)
                layer.has_previous_state[member.index] = True

    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Run the model on ``token_ids`` after the cached tokens; their logits ``[T, vocab]``."""
        logits = []
        for start, stop in self._pieces(len(token_ids)):
            ids = torch.tensor([list(token_ids[start:stop])], device=self.model.device)
            output = self.model(input_ids=ids, cache=self.cache, use_cache=True)
            logits.append(output.logits[0])
            self.num_tokens += stop - start
            chunks, rest = divmod(self.num_tokens, self.layout.tokens_per_chunk)
            if self.state_section is not None and rest == 0:
                self.boundary_states[chunks - 1] = self._snapshot()
        return torch.cat(logits)

    def _pieces(self, count: int) -> list[tuple[int, int]]:
        """``[start, stop)`` pieces of ``count`` new tokens: one, or one per chunk boundary."""
        if self.state_section is None:
            return [(0, count)]
        per_chunk = self.layout.tokens_per_chunk
        first = (per_chunk - self.num_tokens % per_chunk) % per_chunk or per_chunk
        bounds = [0, *range(first, count, per_chunk), count]
        return [(a, b) for a, b in pairwise(bounds) if b > a]

    def _snapshot(self) -> torch.Tensor:
        assert self.state_section is not None
        rows = []
        for index in self.state_section.layers:
            layer = self.cache.layers[index]
            parts = [getattr(layer, m.attr)[m.index].reshape(-1) for m in self.members[index]]
            rows.append(torch.cat(parts))
        return torch.stack(rows).to(TORCH_DTYPES[self.state_section.dtype])

    def pack(self, first_chunk: int, num_chunks: int) -> torch.Tensor:
        """Chunks ``first_chunk ..`` of the tokens run so far, as ``(num_chunks, *chunk_shape)``."""
        layers: list[LayerKV | None] = [
            (layer.keys, layer.values) if getattr(layer, "keys", None) is not None else None
            for layer in self.cache.layers
        ]
        states = None
        if self.state_section is not None:
            wanted = range(first_chunk, first_chunk + num_chunks)
            states = torch.stack([self.boundary_states[chunk] for chunk in wanted])
        return pack_chunks(layers, self.layout, first_chunk - self.first_chunk, num_chunks, states)
