"""Chunk tensors: a host slot's bytes on the device side, and packing per-layer caches into them.

A *chunk tensor* holds one chunk byte for byte as a host slot holds it (``KVLayout``). For an
attention-only layout it is ``(layers, blocks, 2, kv_heads, block_size, head_dim)`` in the KV
dtype; a layout with latent or state layers has sections of several shapes, so its chunk tensor
is the slot's ``chunk_bytes`` as ``uint8``, read through one typed view per section
(``section_views``). A batch of chunks adds a leading dimension.

``pack_chunks`` gathers chunks out of per-layer caches and ``unpack_chunks`` scatters them back,
one strided copy per layer and K/V (never a loop over tokens). ``copy_rank`` moves one rank's
share of a chunk between its own chunk tensor (``KVLayout.rank_layout``) and the full slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch

from kvtier.errors import KVTierError
from kvtier.layout import KVLayout

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
    "uint8": torch.uint8,
}

#: One layer's cache tensors: (K, V) for attention, the latent parts for latent layers.
LayerKV = tuple[torch.Tensor, ...]


def chunk_shape(layout: KVLayout) -> tuple[int, ...]:
    """Shape of one chunk tensor (module docstring)."""
    if layout.is_attention_only:
        return (
            layout.num_layers,
            layout.blocks_per_chunk,
            2,
            layout.num_kv_heads,
            layout.block_size,
            layout.head_dim,
        )
    return (layout.chunk_bytes,)


def chunk_dtype(layout: KVLayout) -> torch.dtype:
    """Element type of a chunk tensor: the KV dtype, or bytes for mixed sections."""
    return TORCH_DTYPES[layout.dtype] if layout.is_attention_only else torch.uint8


@dataclass(frozen=True)
class SectionViews:
    """Typed views of a batch of ``N`` chunk tensors, one per section present.

    ``attention``: ``(N, attention layers, blocks, 2, heads, block_size, head_dim)``;
    ``latent``: ``(N, latent layers, blocks, block_size, latent dim)``;
    ``state``: ``(N, state layers, state elements)``.
    """

    attention: torch.Tensor | None
    latent: torch.Tensor | None
    state: torch.Tensor | None

    def get(self, kind: str) -> torch.Tensor | None:
        view: torch.Tensor | None = getattr(self, kind)
        return view


def section_views(chunks: torch.Tensor, layout: KVLayout) -> SectionViews:
    """Views (never copies) of ``chunks``: ``(N, *chunk_shape)``, or ``(N, chunk_bytes)`` bytes."""
    rows = chunks.view(chunks.shape[0], -1).view(torch.uint8)
    views: dict[str, torch.Tensor] = {}
    for section in layout.sections:
        raw = rows[:, section.offset : section.offset + section.nbytes]
        typed = raw.view(TORCH_DTYPES[section.dtype])
        views[section.kind] = typed.view(rows.shape[0], len(section.layers), *section.page_shape)
    return SectionViews(views.get("attention"), views.get("latent"), views.get("state"))


def _tokens(tensor: torch.Tensor, heads: int, dim: int, what: str) -> torch.Tensor:
    """A layer's ``[1, H, T, D]`` or ``[H, T, D]`` tensor as ``[H, T, D]``, checked."""
    if tensor.dim() == 4:
        if tensor.shape[0] != 1:
            raise KVTierError("pack_chunks: only batch size 1 is supported")
        tensor = tensor[0]
    if tensor.dim() != 3 or tensor.shape[0] != heads or tensor.shape[-1] != dim:
        shape = tuple(tensor.shape)
        raise KVTierError(f"{what} tensor of shape {shape} is not [1, {heads}, T, {dim}]")
    return tensor


def _span(tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    span = tensor[:, start:stop]
    if span.shape[1] != stop - start:
        raise KVTierError(f"pack_chunks: a layer holds {tensor.shape[1]} tokens, needs {stop}")
    return span


def pack_chunks(
    layers: Sequence[LayerKV | None],
    layout: KVLayout,
    first_chunk: int,
    num_chunks: int,
    states: torch.Tensor | None = None,
) -> torch.Tensor:
    """Chunks ``first_chunk ..`` of per-layer caches as ``(num_chunks, *chunk_shape)``.

    ``layers[i]`` is layer ``i``'s (K, V), each ``[1, H, T, D]`` or ``[H, T, D]``, or for a latent
    layer its latent parts ``[1, 1, T, d]``; ``T`` covers the chunks asked for, token 0 being the
    first token of chunk 0. State-only layers may be ``None``. ``states`` holds each chunk's
    boundary states, ``(num_chunks, state layers, state elements)``, iff the layout has any.
    """
    if len(layers) != layout.num_layers:
        raise KVTierError(f"pack_chunks: {len(layers)} layers given, layout has {layout}")
    sample = next(t for kv in layers if kv is not None for t in kv)
    shape = (num_chunks, *chunk_shape(layout))
    out = torch.empty(shape, dtype=chunk_dtype(layout), device=sample.device)
    views = section_views(out, layout)
    tokens = layout.tokens_per_chunk
    start, stop = first_chunk * tokens, (first_chunk + num_chunks) * tokens
    if views.attention is not None:
        _pack_attention(views.attention, layers, layout, start, stop)
    if views.latent is not None:
        _pack_latent(views.latent, layers, layout, start, stop)
    if views.state is not None:
        if states is None or tuple(states.shape) != tuple(views.state.shape):
            got = None if states is None else tuple(states.shape)
            raise KVTierError(f"pack_chunks: states of shape {got}, expected {views.state.shape}")
        views.state.copy_(states)
    return out


def _pack_attention(
    out: torch.Tensor, layers: Sequence[LayerKV | None], layout: KVLayout, start: int, stop: int
) -> None:
    num_chunks, _, blocks, _, heads, block_size, dim = out.shape
    for index, layer in enumerate(layout.layers_of("full", "sliding")):
        kv = layers[layer]
        assert kv is not None, f"attention layer {layer} has no KV"
        for side, tensor in enumerate(kv):
            span = _span(_tokens(tensor, heads, dim, "KV"), start, stop)
            pages = span.reshape(heads, num_chunks, blocks, block_size, dim).permute(1, 2, 0, 3, 4)
            out[:, index, :, side].copy_(pages)


def _pack_latent(
    out: torch.Tensor, layers: Sequence[LayerKV | None], layout: KVLayout, start: int, stop: int
) -> None:
    num_chunks, _, blocks, block_size, _ = out.shape
    for index, layer in enumerate(layout.layers_of("latent")):
        parts = layers[layer]
        assert parts is not None, f"latent layer {layer} has no latent vectors"
        low = 0
        for part, dim in zip(parts, _latent_dims(layout), strict=True):
            span = _span(_tokens(part, 1, dim, "latent"), start, stop)[0]
            pages = span.reshape(num_chunks, blocks, block_size, dim)
            out[:, index, :, :, low : low + dim].copy_(pages)
            low += dim


def _latent_dims(layout: KVLayout) -> tuple[int, ...]:
    group = next(g for g in layout.layer_groups if g.kind == "latent")
    return group.latent_dims


def unpack_chunks(chunks: torch.Tensor, layout: KVLayout) -> list[LayerKV | None]:
    """Per-layer caches from ``(N, *chunk_shape)`` chunks, covering ``N * tokens_per_chunk``.

    Attention layers get (K, V), each ``[1, H, T, D]``; latent layers their latent parts, each
    ``[1, 1, T, d]``; state-only layers ``None`` (their states: ``unpack_states``).
    """
    views = section_views(chunks, layout)
    tokens = chunks.shape[0] * layout.tokens_per_chunk
    layers: list[LayerKV | None] = [None] * layout.num_layers
    if views.attention is not None:
        shape = (1, layout.num_kv_heads, tokens, layout.head_dim)
        for index, layer in enumerate(layout.layers_of("full", "sliding")):
            per_side = views.attention[:, index].permute(2, 3, 0, 1, 4, 5)  # K/V, H, N, B, bs, D
            layers[layer] = (per_side[0].reshape(shape), per_side[1].reshape(shape))
    if views.latent is not None:
        bounds = torch.tensor((0, *_latent_dims(layout))).cumsum(0).tolist()
        for index, layer in enumerate(layout.layers_of("latent")):
            vectors = views.latent[:, index].reshape(1, 1, tokens, -1)
            layers[layer] = tuple(vectors[..., lo:hi].clone() for lo, hi in pairwise(bounds))
    return layers


def unpack_states(chunks: torch.Tensor, layout: KVLayout) -> torch.Tensor | None:
    """Each chunk's boundary states, ``(N, state layers, state elements)``; ``None`` if none."""
    return section_views(chunks, layout).state


def copy_rank(
    local: torch.Tensor,
    slot: torch.Tensor,
    layout: KVLayout,
    tp_rank: int,
    tp_size: int,
    to_slot: bool,
) -> None:
    """Copy the rank's share of one chunk between its chunk tensor ``local`` and ``slot``.

    ``local`` is one chunk of ``layout.rank_layout(tp_rank, tp_size)``; ``slot`` the raw bytes of
    a slot of ``layout``. Storing writes only the rank's runs (``KVLayout.rank_runs``) and, on
    the writing rank, the replicated sections; loading reads the runs and every replicated byte.
    """
    if tp_size == 1:
        source, target = (local, slot) if to_slot else (slot, local)
        _as_bytes(target).copy_(_as_bytes(source), non_blocking=True)
        return
    mine = section_views(local.unsqueeze(0), layout.rank_layout(tp_rank, tp_size))
    full = section_views(slot.view(1, -1), layout)
    heads = layout.rank_heads(tp_rank, tp_size)
    for kind in ("attention", "latent", "state"):
        shared, own = full.get(kind), mine.get(kind)
        if shared is None or own is None:
            continue
        if kind == "attention":
            shared = shared[:, :, :, :, heads.start : heads.stop]
        if not to_slot:
            own.copy_(shared, non_blocking=True)
        elif layout.rank_writes(tp_rank, tp_size, kind):
            shared.copy_(own, non_blocking=True)


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(-1).view(torch.uint8)
