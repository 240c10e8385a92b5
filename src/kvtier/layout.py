"""KVLayout: how one chunk of KV cache is laid out in a host slot, whatever the parallelism.

A chunk is ``blocks_per_chunk`` engine blocks of ``block_size`` tokens, for every layer. Layers
come in *groups* of one kind (``LayerGroup``); a layout without groups is all full attention.
A slot holds up to three *sections*, back to back, each in layer order:

1. attention pages (``full`` and ``sliding`` layers): one page per layer and block, holding
   **all** KV heads in head order, K first then V::

       page = K[head][token][dim] ++ V[head][token][dim]

2. latent pages (``latent``, MLA-style): one page per layer and block, one latent vector per
   token and no head split: ``page = latent[token][dim]`` with ``dim = sum(latent_dims)``;
3. state pages (``state``, Mamba-style): one page per layer, the layer's state tensors after the
   chunk's last token, flattened one after the other (in the group's dtype).

A layout of attention layers only is section 1 alone, the classic layout. Every chunk of a
layout has one fixed size (``chunk_bytes``) whatever its layer kinds.

Tensor parallelism does not change the bytes: rank ``r`` of ``p`` owns ``rank_runs(r, p)`` of
every attention page (its heads' K run and V run) and copies only those into the shared slot;
latent and state pages are replicated on every rank, written by rank 0 and read by all.

Resuming after a prefix needs every chunk of it for full and latent layers, but only the
trailing chunks inside the window for sliding layers and only the last chunk for state layers:
``window_chunks`` says how many, ``resume_start`` where they begin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from kvtier.errors import ConfigError

#: Bumped whenever the canonical byte order of a slot changes; part of the cache identity.
#: 2: layer groups (sliding, latent and state sections).
LAYOUT_VERSION = 2

DTYPE_SIZES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}

FULL, SLIDING, LATENT, STATE = "full", "sliding", "latent", "state"
KINDS = (FULL, SLIDING, LATENT, STATE)
ATTENTION = (FULL, SLIDING)  # kinds whose pages are K and V per KV head


#: The most layers a layout may have: far past any model's, and the default layer group lists
#: every layer (a layout of 2**40 layers ran out of memory instead of being refused).
MAX_LAYERS = 1 << 16


def _positive(owner: str, name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{owner}.{name}: expected a positive integer, got {value!r}")


def _dtype(owner: str, value: str) -> None:
    if not isinstance(value, str) or value not in DTYPE_SIZES:
        known = ", ".join(sorted(DTYPE_SIZES))
        raise ConfigError(f"{owner}.dtype: expected one of {known}, got {value!r}")


@dataclass(frozen=True)
class LayerGroup:
    """Layers that share one kind of cache.

    * ``full``: attention over the whole prefix;
    * ``sliding``: attention over the last ``window`` tokens, the query's own included (as
      transformers' ``sliding_window``);
    * ``latent``: one vector per token made of ``latent_dims`` parts (DeepSeek MLA: the
      compressed KV then the rotary key), shared by all heads;
    * ``state``: a recurrent state per layer, the tensors of ``state_shapes`` (e.g. a conv state
      and an SSM state), stored in ``dtype`` (default: the layout's).

    A layer belongs to at most one of full, sliding and latent, and to at most one state group
    (a layer with attention *and* a state, like Falcon-H1's, is in two groups).
    """

    kind: str
    layers: tuple[int, ...]
    window: int = 0
    latent_dims: tuple[int, ...] = ()
    state_shapes: tuple[tuple[int, ...], ...] = ()
    dtype: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "latent_dims", tuple(self.latent_dims))
        object.__setattr__(self, "state_shapes", tuple(tuple(s) for s in self.state_shapes))
        if self.kind not in KINDS:
            raise ConfigError(f"LayerGroup.kind: expected one of {KINDS}, got {self.kind!r}")
        if not self.layers or len(set(self.layers)) != len(self.layers):
            raise ConfigError(f"LayerGroup.layers: expected distinct layers, got {self.layers}")
        self._check_kind_fields()

    def _check_kind_fields(self) -> None:
        owner = f"LayerGroup({self.kind})"
        expected = {
            "window": self.kind == SLIDING,
            "latent_dims": self.kind == LATENT,
            "state_shapes": self.kind == STATE,
        }
        for name, wanted in expected.items():
            if bool(getattr(self, name)) != wanted:
                raise ConfigError(f"{owner}.{name}: {'required' if wanted else 'not allowed'}")
        if self.kind == SLIDING:
            _positive(owner, "window", self.window)
        if self.kind == SLIDING and self.window < 2:
            raise ConfigError(f"{owner}.window: expected at least 2 tokens, got {self.window}")
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in self.layers):
            raise ConfigError(f"{owner}.layers: expected layer indices, got {self.layers}")
        for dim in (*self.latent_dims, *(d for shape in self.state_shapes for d in shape)):
            _positive(owner, "latent_dims/state_shapes", dim)
        if self.dtype is not None:
            _dtype(owner, self.dtype)

    @property
    def state_elems(self) -> int:
        return sum(math.prod(shape) for shape in self.state_shapes)

    def describe(self) -> dict[str, Any]:
        """Every field that decides bytes, as plain JSON-able values."""
        return {
            "kind": self.kind,
            "layers": list(self.layers),
            "window": self.window,
            "latent_dims": list(self.latent_dims),
            "state_shapes": [list(shape) for shape in self.state_shapes],
            "dtype": self.dtype,
        }


@dataclass(frozen=True)
class Section:
    """A run of same-shaped pages in a slot: ``len(layers) x page_shape`` of ``dtype``."""

    kind: str  # "attention", "latent" or "state"
    layers: tuple[int, ...]
    page_shape: tuple[int, ...]  # per layer
    dtype: str
    offset: int

    @property
    def layer_bytes(self) -> int:
        return math.prod(self.page_shape) * DTYPE_SIZES[self.dtype]

    @property
    def nbytes(self) -> int:
        return len(self.layers) * self.layer_bytes


@dataclass(frozen=True)
class KVLayout:
    """Shape of a model's KV cache and the canonical byte order of a chunk (module docstring).

    ``num_kv_heads`` and ``head_dim`` describe the attention layers; ``groups`` (default: every
    layer full attention) say which layers are sliding, latent or state layers.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    block_size: int = 16
    blocks_per_chunk: int = 16
    groups: tuple[LayerGroup, ...] = ()

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size", "blocks_per_chunk"):
            _positive("KVLayout", name, getattr(self, name))
        if self.num_layers > MAX_LAYERS:
            raise ConfigError(f"KVLayout.num_layers: at most {MAX_LAYERS}, got {self.num_layers}")
        _dtype("KVLayout", self.dtype)
        if not isinstance(self.groups, list | tuple) or not all(
            isinstance(g, LayerGroup) for g in self.groups
        ):
            raise ConfigError("KVLayout.groups: expected a list of LayerGroup")
        object.__setattr__(self, "groups", tuple(self.groups))
        self._check_groups()

    def _check_groups(self) -> None:
        kv_layers = [n for g in self.layer_groups if g.kind != STATE for n in g.layers]
        state_layers = [n for g in self.layer_groups if g.kind == STATE for n in g.layers]
        for name, layers in (("KV", kv_layers), ("state", state_layers)):
            if len(set(layers)) != len(layers):
                raise ConfigError(f"KVLayout.groups: a layer is in two {name} groups")
        if set(kv_layers) | set(state_layers) != set(range(self.num_layers)):
            raise ConfigError(f"KVLayout.groups: must cover layers 0..{self.num_layers - 1}")
        for kind in (LATENT, STATE):
            if sum(g.kind == kind for g in self.layer_groups) > 1:
                raise ConfigError(f"KVLayout.groups: at most one {kind} group")

    # -- sizes -------------------------------------------------------------------------------
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
        """Bytes of one attention page (one block of one layer): K and V of every head."""
        return 2 * self.num_kv_heads * self.head_bytes

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one chunk, which is the size of one host slot."""
        return sum(section.nbytes for section in self.sections)

    # -- groups and sections -----------------------------------------------------------------
    @cached_property
    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """``groups``, or one full-attention group of every layer when none were given."""
        return self.groups or (LayerGroup(FULL, tuple(range(self.num_layers))),)

    @property
    def is_attention_only(self) -> bool:
        """Every layer is full or sliding attention: the slot is one attention section."""
        return all(g.kind in ATTENTION for g in self.layer_groups)

    def layers_of(self, *kinds: str) -> tuple[int, ...]:
        """The layers of the given kinds, in layer order."""
        return tuple(sorted(n for g in self.layer_groups if g.kind in kinds for n in g.layers))

    def group_of(self, layer: int, state: bool = False) -> LayerGroup | None:
        """The KV group (or with ``state``, the state group) of ``layer``; ``None`` if none."""
        for group in self.layer_groups:
            if (group.kind == STATE) == state and layer in group.layers:
                return group
        return None

    @cached_property
    def sections(self) -> tuple[Section, ...]:
        """The slot's sections in byte order: attention, latent, state (those present)."""
        blocks, block_size = self.blocks_per_chunk, self.block_size
        attention: tuple[int, ...] = (blocks, 2, self.num_kv_heads, block_size, self.head_dim)
        planned = [("attention", self.layers_of(*ATTENTION), attention, self.dtype)]
        for group in self.layer_groups:
            if group.kind == LATENT:
                latent = (blocks, block_size, sum(group.latent_dims))
                planned.append(("latent", self.layers_of(LATENT), latent, self.dtype))
            if group.kind == STATE:
                state = (group.state_elems,)
                planned.append(("state", group.layers, state, group.dtype or self.dtype))
        planned.sort(key=lambda plan: ("attention", "latent", "state").index(plan[0]))
        sections: list[Section] = []
        offset = 0
        for kind, layers, shape, dtype in planned:
            if layers:
                sections.append(Section(kind, tuple(sorted(layers)), shape, dtype, offset))
                offset += sections[-1].nbytes
        return tuple(sections)

    def section(self, kind: str) -> Section | None:
        """The section ``attention``, ``latent`` or ``state``; ``None`` if the slot has none."""
        return next((s for s in self.sections if s.kind == kind), None)

    def page_offset(self, layer: int, block: int) -> int:
        """Byte offset of the attention or latent page of (``layer``, ``block``) in the slot."""
        if not 0 <= block < self.blocks_per_chunk:
            raise IndexError(f"block {block} out of range [0, {self.blocks_per_chunk})")
        for section in self.sections:
            if section.kind != "state" and layer in section.layers:
                start = section.offset + section.layers.index(layer) * section.layer_bytes
                return start + block * (section.layer_bytes // self.blocks_per_chunk)
        raise IndexError(f"layer {layer} has no attention or latent pages in {self}")

    def state_offset(self, layer: int) -> int:
        """Byte offset of ``layer``'s state page in the slot."""
        section = self.section("state")
        if section is None or layer not in section.layers:
            raise IndexError(f"layer {layer} has no state page")
        return section.offset + section.layers.index(layer) * section.layer_bytes

    # -- resuming ----------------------------------------------------------------------------
    @cached_property
    def window_chunks(self) -> int | None:
        """Trailing chunks a resume after a prefix needs; ``None`` when it needs all of them.

        Full and latent layers need the whole prefix. A sliding layer of window ``W`` needs the
        ``W - 1`` tokens before the next query, so ``ceil((W - 1) / tokens_per_chunk)`` chunks; a
        state layer needs the state of the last chunk only.
        """
        needs = []
        for group in self.layer_groups:
            if group.kind in (FULL, LATENT):
                return None
            window = group.window - 1 if group.kind == SLIDING else 1
            needs.append(max(1, -(-window // self.tokens_per_chunk)))
        return max(needs)

    def resume_start(self, num_chunks: int) -> int:
        """First chunk of a ``num_chunks``-chunk prefix that a resume needs loaded."""
        window = self.window_chunks
        return 0 if window is None else max(0, num_chunks - window)

    # -- tensor parallelism ------------------------------------------------------------------
    def rank_heads(self, tp_rank: int, tp_size: int) -> range:
        """KV heads rank ``tp_rank`` of ``tp_size`` holds: a share, or one replicated head."""
        heads = self.num_kv_heads
        if tp_size < 1 or not 0 <= tp_rank < tp_size:
            raise ConfigError(f"tp_rank {tp_rank} out of range for tp_size {tp_size}")
        if heads % tp_size and tp_size % heads:
            raise ConfigError(f"tp_size {tp_size}: {heads} KV heads cannot be split evenly")
        if tp_size <= heads:
            share = heads // tp_size
            return range(tp_rank * share, (tp_rank + 1) * share)
        head = tp_rank * heads // tp_size
        return range(head, head + 1)

    def rank_runs(self, tp_rank: int, tp_size: int) -> list[tuple[int, int]]:
        """``(offset, length)`` byte runs of each attention page that the rank owns: K, V."""
        heads = self.rank_heads(tp_rank, tp_size)
        length = len(heads) * self.head_bytes
        k_run = heads.start * self.head_bytes
        return [(k_run, length), (k_run + self.num_kv_heads * self.head_bytes, length)]

    def rank_writes(self, tp_rank: int, tp_size: int, kind: str) -> bool:
        """Whether the rank writes section ``kind``: replicated bytes are written by one rank."""
        if kind != "attention":
            return tp_rank == 0
        replicas = max(1, tp_size // self.num_kv_heads)
        return tp_rank % replicas == 0

    def rank_layout(self, tp_rank: int, tp_size: int) -> KVLayout:
        """The layout of the rank's own chunk tensors: its KV heads, every other section whole.

        Device-side only: slots and identities always use the full layout.
        """
        heads = len(self.rank_heads(tp_rank, tp_size))
        return KVLayout(
            self.num_layers,
            heads,
            self.head_dim,
            self.dtype,
            self.block_size,
            self.blocks_per_chunk,
            self.groups,
        )

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
            "groups": [group.describe() for group in self.layer_groups],
        }
