"""Layer groups: one fixed chunk size for every layer kind, their byte order, and what a resume
after a prefix needs (``window_chunks``), down to the manager's windowed lookup."""

from __future__ import annotations

import math

import pytest
import torch

from kvtier import CacheIdentity, ConfigError, KVLayout, TieringManager
from kvtier.config import MemoryTierConfig
from kvtier.device.pages import pack_chunks, unpack_chunks, unpack_states
from kvtier.device.transfer import TransferEngine
from kvtier.layout import LAYOUT_VERSION, LayerGroup
from kvtier.region import HostRegion
from kvtier.tiers.memory import MemoryTier
from tests.conftest import config, make_keys, push_out, read, settle, store

HYBRID = KVLayout(
    4,
    2,
    8,
    "float32",
    block_size=4,
    blocks_per_chunk=2,
    groups=(
        LayerGroup("full", (1,)),
        LayerGroup("sliding", (3,), window=9),
        LayerGroup("latent", (0, 2), latent_dims=(6, 2)),
        LayerGroup("state", (0, 1), state_shapes=((3, 4), (2, 5))),
    ),
)


def test_every_layer_kind_has_its_section_and_the_chunk_one_size() -> None:
    attention = 2 * 2 * 2 * 4 * 8 * 4  # blocks x K/V x heads x tokens x dim x float32
    latent = 2 * 4 * 8 * 4  # blocks x tokens x (6 + 2) x float32
    state = (12 + 10) * 4
    assert [(s.kind, s.layers, s.offset) for s in HYBRID.sections] == [
        ("attention", (1, 3), 0),
        ("latent", (0, 2), 2 * attention),
        ("state", (0, 1), 2 * attention + 2 * latent),
    ]
    assert HYBRID.chunk_bytes == 2 * attention + 2 * latent + 2 * state
    assert HYBRID.page_offset(3, 1) == attention + attention // 2
    assert HYBRID.page_offset(2, 1) == 2 * attention + latent + latent // 2
    assert HYBRID.state_offset(1) == 2 * attention + 2 * latent + state
    with pytest.raises(IndexError):
        HYBRID.state_offset(2)


def test_a_layout_without_groups_is_all_full_attention() -> None:
    plain = KVLayout(2, 2, 8, "float32", 4, 2)
    explicit = KVLayout(2, 2, 8, "float32", 4, 2, groups=(LayerGroup("full", (0, 1)),))
    assert plain.describe() == explicit.describe()
    assert plain.describe()["layout_version"] == LAYOUT_VERSION
    assert plain.chunk_bytes == 2 * 2 * plain.page_bytes and plain.window_chunks is None


def test_everything_that_changes_bytes_changes_the_identity() -> None:
    def digest(**group: object) -> bytes:
        layout = KVLayout(2, 2, 8, "float32", 4, 2, groups=(LayerGroup(**group),))
        return CacheIdentity("m", layout).digest

    sliding = {"kind": "sliding", "layers": (0, 1)}
    assert digest(**sliding, window=9) != digest(**sliding, window=17)
    assert digest(**sliding, window=9) != digest(kind="full", layers=(0, 1))
    assert digest(kind="state", layers=(0, 1), state_shapes=((4,),), dtype="float32") != digest(
        kind="state", layers=(0, 1), state_shapes=((4,),), dtype="bfloat16"
    )


@pytest.mark.parametrize(
    "groups",
    [
        (LayerGroup("full", (0,)),),  # layer 1 in no group
        (LayerGroup("full", (0, 1)), LayerGroup("sliding", (1,), window=4)),  # two KV groups
        (
            LayerGroup("latent", (0,), latent_dims=(4,)),
            LayerGroup("latent", (1,), latent_dims=(4,)),
        ),
        (LayerGroup("full", (0, 1, 2)),),  # no layer 2
    ],
)
def test_impossible_groups_are_refused(groups: tuple[LayerGroup, ...]) -> None:
    with pytest.raises(ConfigError, match="groups"):
        KVLayout(2, 2, 8, "float32", 4, 2, groups=groups)


@pytest.mark.parametrize(
    "fields",
    [{"kind": "sliding"}, {"kind": "sliding", "window": 1}, {"kind": "full", "window": 8},
     {"kind": "latent"}, {"kind": "state"}, {"kind": "moe"}, {"kind": "full", "layers": ()}],
)  # fmt: skip
def test_impossible_group_fields_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        LayerGroup(**{"layers": (0,), **fields})


@pytest.mark.parametrize(
    ("groups", "window"),
    [
        ((LayerGroup("sliding", (0, 1), window=9),), 1),  # 8 tokens before the next query
        ((LayerGroup("sliding", (0, 1), window=10),), 2),  # 9 tokens: two 8-token chunks
        (
            (
                LayerGroup("sliding", (0,), window=30),
                LayerGroup("state", (1,), state_shapes=((2,),)),
            ),
            4,
        ),
        ((LayerGroup("state", (0, 1), state_shapes=((2,),)),), 1),  # the last chunk's state
        ((LayerGroup("sliding", (0,), window=9), LayerGroup("full", (1,))), None),
    ],
)
def test_window_chunks(groups: tuple[LayerGroup, ...], window: int | None) -> None:
    layout = KVLayout(2, 2, 8, "float32", 4, 2, groups=groups)
    assert layout.window_chunks == window
    assert layout.resume_start(6) == (0 if window is None else 6 - window)


def test_pack_and_unpack_every_kind_in_the_canonical_order() -> None:
    """Pages land at ``page_offset`` / ``state_offset``, and come back exactly."""
    gen = torch.Generator().manual_seed(0)
    tokens = 2 * HYBRID.tokens_per_chunk

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen)

    layers: list[tuple[torch.Tensor, ...] | None] = [None] * 4
    for layer in (1, 3):
        layers[layer] = (rand(1, 2, tokens, 8), rand(1, 2, tokens, 8))
    for layer in (0, 2):
        layers[layer] = (rand(1, 1, tokens, 6), rand(1, 1, tokens, 2))
    states = rand(2, 2, 22)
    chunks = pack_chunks(layers, HYBRID, 0, 2, states)
    raw = chunks[1].numpy().tobytes()
    span = slice(HYBRID.tokens_per_chunk + 4, HYBRID.tokens_per_chunk + 8)  # chunk 1, block 1
    k3, v3 = layers[3]
    page = b"".join(t[0, h, span].numpy().tobytes() for t in (k3, v3) for h in range(2))
    assert raw[HYBRID.page_offset(3, 1) :][: len(page)] == page
    latent = torch.cat([part[0, 0, span] for part in layers[2]], dim=-1)
    assert raw[HYBRID.page_offset(2, 1) :][: latent.numel() * 4] == latent.numpy().tobytes()
    assert raw[HYBRID.state_offset(1) :][:88] == states[1, 1].numpy().tobytes()
    back = unpack_chunks(chunks, HYBRID)
    for got, want in zip(back, layers, strict=True):
        assert (got is None) == (want is None)
        assert got is None or all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert torch.equal(unpack_states(chunks, HYBRID), states)


def test_hybrid_chunks_round_trip_through_host_slots() -> None:
    region = HostRegion(2, HYBRID.chunk_bytes, pin=False)
    engine = TransferEngine(HYBRID, region, "cpu")
    chunks = torch.randint(0, 256, (2, HYBRID.chunk_bytes), dtype=torch.uint8)
    engine.wait(engine.submit_store(chunks, [1, 0]))
    assert bytes(region.view(1)) == chunks[0].numpy().tobytes()
    loaded = engine.wait(engine.submit_load([1, 0])).chunks
    assert loaded is not None and torch.equal(loaded, chunks)
    assert math.prod(loaded.shape[1:]) == HYBRID.chunk_bytes


# -- the manager's windowed lookup: a sliding-window layout needs the last 2 chunks ------------
WINDOWED = KVLayout(2, 2, 16, "float32", 4, 2, groups=(LayerGroup("sliding", (0, 1), window=12),))


@pytest.fixture
def windowed() -> CacheIdentity:
    return CacheIdentity("test/sliding", WINDOWED, "r1")


@pytest.fixture
def build(windowed: CacheIdentity):
    managers = []

    def make(num_slots: int, with_tier: bool = False) -> TieringManager:
        def memory(region: HostRegion, identity: CacheIdentity) -> MemoryTier:
            return MemoryTier(MemoryTierConfig(), region, identity)

        m = TieringManager(config(num_slots, WINDOWED), windowed, tiers=[memory] * with_tier)
        managers.append(m)
        return m

    yield make
    for m in managers:
        m.close()


def test_windowed_lookup_needs_only_the_trailing_chunks(build, windowed) -> None:
    """Chunks 3-4 of a 5-chunk prefix are enough to resume after all 5."""
    m = build(8)
    keys = make_keys(windowed, 5)
    store(m, keys[3:])
    assert m.lookup(keys) == 5 and read(m, keys[WINDOWED.resume_start(5) :])


def test_windowed_lookup_falls_back_before_a_missing_chunk(build, windowed) -> None:
    """Chunk 3 is missing: the longest resumable prefix is chunks 0-2 (window: chunks 1-2)."""
    m = build(8)
    keys = make_keys(windowed, 5)
    store(m, [keys[1], keys[2], keys[4]])
    assert m.lookup(keys) == 3
    store(m, [keys[0]])
    assert m.lookup(keys[:1]) == 1


def test_windowed_lookup_promotes_only_the_window(build, windowed) -> None:
    """All 5 chunks left host for the tier; only the last 2 are promoted back."""
    m = build(5, with_tier=True)
    keys = make_keys(windowed, 5)
    store(m, keys)
    push_out(m, windowed, 5)
    assert settle(m, keys) == 5
    assert [m.host.is_ready(k) for k in keys] == [False, False, False, True, True]
    assert read(m, keys[3:])
