"""Transfer engine: canonical page order in host slots, round trips, and job bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvtier import KVLayout
from kvtier.device.pages import TORCH_DTYPES, chunk_shape, pack_chunks, unpack_chunks
from kvtier.device.transfer import TransferEngine, slot_tensor
from kvtier.errors import KVTierError
from kvtier.region import HostRegion

LAYOUT = KVLayout(
    num_layers=3, num_kv_heads=2, head_dim=8, dtype="float32", block_size=4, blocks_per_chunk=2
)


def random_kv(
    layout: KVLayout, tokens: int, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    shape = (1, layout.num_kv_heads, tokens, layout.head_dim)
    dtype = TORCH_DTYPES[layout.dtype]
    return [
        (torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))
        for _ in range(layout.num_layers)
    ]


def reference_slot_bytes(
    kv: list[tuple[torch.Tensor, torch.Tensor]], layout: KVLayout, chunk: int
) -> bytes:
    """Slot bytes built page by page from KVLayout's offsets, independently of transfer.py."""
    out = bytearray(layout.chunk_bytes)
    for layer, (k, v) in enumerate(kv):
        for block in range(layout.blocks_per_chunk):
            start = chunk * layout.tokens_per_chunk + block * layout.block_size
            span = slice(start, start + layout.block_size)
            page = b"".join(
                t[0, head, span].contiguous().view(torch.uint8).numpy().tobytes()
                for t in (k, v)
                for head in range(layout.num_kv_heads)
            )
            assert len(page) == layout.page_bytes
            offset = layout.page_offset(layer, block)
            out[offset : offset + layout.page_bytes] = page
    return bytes(out)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_store_writes_the_canonical_page_order(dtype: str) -> None:
    """Chunks 1 and 2 of a 3-chunk KV land in slots 3 and 0 exactly as DESIGN.md lays pages."""
    layout = KVLayout(3, 2, 8, dtype=dtype, block_size=4, blocks_per_chunk=2)
    region = HostRegion(4, layout.chunk_bytes, pin=False)
    engine = TransferEngine(layout, region, "cpu")
    kv = random_kv(layout, 3 * layout.tokens_per_chunk)
    job_id = engine.submit_store(pack_chunks(kv, layout, 1, 2), [3, 0])
    assert [r.job_id for r in engine.poll()] == [job_id]
    assert bytes(region.view(3)) == reference_slot_bytes(kv, layout, 1)
    assert bytes(region.view(0)) == reference_slot_bytes(kv, layout, 2)


def test_load_then_unpack_gives_back_the_tokens() -> None:
    """A store then a load through other slots rebuilds K and V of the stored tokens exactly."""
    region = HostRegion(3, LAYOUT.chunk_bytes, pin=False)
    engine = TransferEngine(LAYOUT, region, "cpu")
    kv = random_kv(LAYOUT, 2 * LAYOUT.tokens_per_chunk + 3, seed=1)
    engine.wait(engine.submit_store(pack_chunks(kv, LAYOUT, 0, 2), [2, 1]))
    loaded = engine.wait(engine.submit_load([2, 1])).chunks
    assert loaded is not None and tuple(loaded.shape) == (2, *chunk_shape(LAYOUT))
    tokens = 2 * LAYOUT.tokens_per_chunk
    for (k, v), (k2, v2) in zip(kv, unpack_chunks(loaded, LAYOUT), strict=True):
        assert torch.equal(k[:, :, :tokens], k2) and torch.equal(v[:, :, :tokens], v2)


def test_loaded_chunks_do_not_alias_the_slots() -> None:
    """Once a load finished, rewriting the slot does not change the loaded tensor."""
    region = HostRegion(1, LAYOUT.chunk_bytes, pin=False)
    engine = TransferEngine(LAYOUT, region, "cpu")
    region.numpy(0)[:] = 7
    loaded = engine.wait(engine.submit_load([0])).chunks
    assert loaded is not None
    before = loaded.clone()
    region.numpy(0)[:] = 9
    assert torch.equal(loaded, before)


def test_jobs_are_handed_out_once() -> None:
    region = HostRegion(2, LAYOUT.chunk_bytes, pin=False)
    engine = TransferEngine(LAYOUT, region, "cpu")
    ids = [engine.submit_load([0]), engine.submit_load([1]), engine.submit_load([0, 1])]
    assert len(set(ids)) == 3
    assert engine.wait(ids[1]).slots == (1,)
    assert sorted(r.job_id for r in engine.poll()) == [ids[0], ids[2]]
    assert engine.poll() == [] and engine.num_pending_jobs == 0


def test_slot_tensor_shares_the_region() -> None:
    region = HostRegion(2, LAYOUT.chunk_bytes, pin=False)
    region.numpy(0)[:] = 0
    slot_tensor(LAYOUT, region, 1).fill_(1.5)
    values = np.frombuffer(region.view(1), dtype=np.float32)
    assert (values == 1.5).all() and not np.frombuffer(region.view(0), np.float32).any()


def test_wrong_shapes_are_refused() -> None:
    region = HostRegion(2, LAYOUT.chunk_bytes, pin=False)
    engine = TransferEngine(LAYOUT, region, "cpu")
    with pytest.raises(KVTierError):
        engine.submit_store(torch.zeros((1, *chunk_shape(LAYOUT))), [0, 1])
    with pytest.raises(KVTierError):
        pack_chunks(random_kv(LAYOUT, 5), LAYOUT, 0, 1)  # 5 tokens cannot fill one chunk of 8
    with pytest.raises(KVTierError):
        TransferEngine(LAYOUT, HostRegion(1, LAYOUT.chunk_bytes + 4, pin=False), "cpu")


def test_a_store_writes_its_slots_only_padding_and_others_untouched() -> None:
    """On CPU a job is one scatter over the region's rows: it must stop at each slot's end."""
    region = HostRegion(4, LAYOUT.chunk_bytes, pin=False)
    assert region.stride > region.slot_bytes  # the padding this test watches
    engine = TransferEngine(LAYOUT, region, "cpu")
    for slot in range(4):
        region.aligned_view(slot)[:] = b"\xab" * region.stride
    kv = random_kv(LAYOUT, 2 * LAYOUT.tokens_per_chunk, seed=3)
    engine.wait(engine.submit_store(pack_chunks(kv, LAYOUT, 0, 2), [3, 1]))
    for slot in (0, 2):
        assert set(bytes(region.aligned_view(slot))) == {0xAB}
    for slot, chunk in ((3, 0), (1, 1)):
        assert bytes(region.view(slot)) == reference_slot_bytes(kv, LAYOUT, chunk)
        assert set(bytes(region.aligned_view(slot))[region.slot_bytes :]) == {0xAB}


def test_a_strided_batch_stores_like_a_contiguous_one() -> None:
    region = HostRegion(4, LAYOUT.chunk_bytes, pin=False)
    engine = TransferEngine(LAYOUT, region, "cpu")
    kv = random_kv(LAYOUT, 4 * LAYOUT.tokens_per_chunk, seed=4)
    every_other = pack_chunks(kv, LAYOUT, 0, 4)[::2]
    assert not every_other.is_contiguous()
    engine.wait(engine.submit_store(every_other, [0, 1]))
    assert bytes(region.view(0)) == reference_slot_bytes(kv, LAYOUT, 0)
    assert bytes(region.view(1)) == reference_slot_bytes(kv, LAYOUT, 2)


def test_a_load_into_given_tensors_fills_them_and_allocates_no_batch() -> None:
    """``out``: each slot lands in its own tensor (here rows of another buffer, in any order)."""
    region = HostRegion(3, LAYOUT.chunk_bytes, pin=False)
    engine = TransferEngine(LAYOUT, region, "cpu")
    kv = random_kv(LAYOUT, 2 * LAYOUT.tokens_per_chunk, seed=4)
    packed = pack_chunks(kv, LAYOUT, 0, 2)
    engine.wait(engine.submit_store(packed, [2, 0]))
    pool = torch.zeros((4, *chunk_shape(LAYOUT)), dtype=torch.float32)
    out = [pool[3], pool[1]]
    result = engine.wait(engine.submit_load([2, 0], out=out))
    assert result.chunks is None
    assert torch.equal(pool[3], packed[0]) and torch.equal(pool[1], packed[1])
    assert not pool[0].any() and not pool[2].any()


@pytest.mark.parametrize(
    "out",
    [
        [torch.zeros(chunk_shape(LAYOUT))],  # one tensor for two slots
        [torch.zeros(chunk_shape(LAYOUT)), torch.zeros(3)],  # a wrong shape
        [torch.zeros(chunk_shape(LAYOUT)), torch.zeros(chunk_shape(LAYOUT), dtype=torch.int32)],
        [torch.zeros(chunk_shape(LAYOUT)), torch.zeros(chunk_shape(LAYOUT)[::-1]).mT],  # strided
        [torch.zeros(chunk_shape(LAYOUT)), "not a tensor"],
    ],
)
def test_a_wrong_out_is_refused_before_any_copy(out: list[object]) -> None:
    region = HostRegion(2, LAYOUT.chunk_bytes, pin=False)
    region.numpy(0)[:] = 7
    engine = TransferEngine(LAYOUT, region, "cpu")
    with pytest.raises(KVTierError, match="out"):
        engine.submit_load([0, 1], out=out)  # type: ignore[arg-type]
    assert engine.num_pending_jobs == 0
    assert not out[0].any()  # type: ignore[union-attr]
