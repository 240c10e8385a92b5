"""Tensor parallelism: ranks of any TP size write and read the same canonical slot bytes.

A Llama model with 4 KV heads runs a prompt; its K/V are split by heads across simulated ranks
(what each rank of a TP group holds), each rank copies only its runs into the shared host slots,
and readers of another TP size load them back. Bytes and model outputs must be identical.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from kvtier import CacheIdentity, ConfigError, KVLayout, TieringConfig, TieringManager, chunk_keys
from kvtier.device.pages import chunk_shape, pack_chunks, unpack_chunks
from kvtier.device.transfer import TransferEngine
from kvtier.layout import LayerGroup
from kvtier.region import ALIGNMENT, HostRegion, round_up
from kvtier.tiers.base import RETRY

SHAPE = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
}
CHUNKS, EXTRA = 3, 5  # prompt: 3 chunks of 8 tokens, then 5 more tokens to run


@pytest.fixture(scope="module")
def setup() -> tuple[Any, CacheIdentity, list[int], list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE)).eval()
    layout = KVLayout(2, 4, 16, "float32", block_size=4, blocks_per_chunk=2)
    identity = CacheIdentity("test/llama-4kv", layout, "r1")
    tokens = torch.randint(
        0, 512, (CHUNKS * 8 + EXTRA,), generator=torch.Generator().manual_seed(1)
    )
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=tokens[None, : CHUNKS * 8], cache=cache, use_cache=True)
    kv = [(layer.keys, layer.values) for layer in cache.layers]
    return model, identity, tokens.tolist(), kv


def make_manager(
    identity: CacheIdentity, tiers: list[dict[str, Any]] | None = None
) -> TieringManager:
    stride = round_up(identity.layout.chunk_bytes, ALIGNMENT)
    config = {"cpu_bytes_to_use": 8 * stride, "secondary_tiers": tiers or []}
    return TieringManager(TieringConfig.from_dict(config), identity)


def store_as_ranks(m: TieringManager, kv: list[Any], keys: list[Any], tp_size: int) -> list[int]:
    """Every rank packs its own heads and copies its runs into the same slots."""
    plan = m.prepare_store(keys)
    assert plan is not None and plan.keys == keys
    for rank in range(tp_size):
        engine = TransferEngine(m.identity.layout, m.region, "cpu", tp_rank=rank, tp_size=tp_size)
        heads = m.identity.layout.rank_heads(rank, tp_size)
        local = [(k[:, heads.start : heads.stop], v[:, heads.start : heads.stop]) for k, v in kv]
        engine.wait(
            engine.submit_store(pack_chunks(local, engine.local_layout, 0, len(keys)), plan.slots)
        )
    m.complete_store(plan.keys)
    return plan.slots


def load_as_ranks(
    m: TieringManager, keys: list[Any], tp_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every rank loads its runs; their heads, concatenated, are what a TP=1 engine holds."""
    slots = m.prepare_load(keys)
    shards = []
    for rank in range(tp_size):
        engine = TransferEngine(m.identity.layout, m.region, "cpu", tp_rank=rank, tp_size=tp_size)
        chunks = engine.wait(engine.submit_load(slots)).chunks
        assert chunks is not None
        shards.append(unpack_chunks(chunks, engine.local_layout))
    m.complete_load(keys)
    return [
        (torch.cat([s[layer][0] for s in shards], 1), torch.cat([s[layer][1] for s in shards], 1))
        for layer in range(m.identity.layout.num_layers)
    ]


def resume(model: Any, kv: list[Any], tokens: list[int]) -> tuple[torch.Tensor, list[int]]:
    """Logits of the tokens after the restored prefix, and 3 greedy tokens."""
    cache = DynamicCache([(k.clone(), v.clone()) for k, v in kv], config=model.config)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([tokens[CHUNKS * 8 :]]), cache=cache).logits[0]
        greedy = [int(logits[-1].argmax())]
        for _ in range(2):
            step = model(input_ids=torch.tensor([[greedy[-1]]]), cache=cache).logits[0, -1]
            greedy.append(int(step.argmax()))
    return logits, greedy


def recompute(model: Any, tokens: list[int]) -> tuple[torch.Tensor, list[int]]:
    ids = torch.tensor([tokens])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, CHUNKS * 8 :]
        out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    return logits, out[0, len(tokens) :].tolist()


@pytest.mark.parametrize(("writer", "readers"), [(2, (1, 4)), (1, (2,)), (4, (2,))])
def test_any_tp_size_reads_what_another_wrote(
    setup: Any, writer: int, readers: tuple[int, ...]
) -> None:
    """TP=2 writes, TP=1 and TP=4 read (and the reverse): identical K/V, identical outputs."""
    model, identity, tokens, kv = setup
    keys = chunk_keys(tokens, identity)[:CHUNKS]
    expected_logits, expected_tokens = recompute(model, tokens)
    with make_manager(identity) as m:
        store_as_ranks(m, kv, keys, writer)
        loads = {tp: load_as_ranks(m, keys, tp) for tp in readers}
    outputs = {tp: resume(model, loaded, tokens) for tp, loaded in loads.items()}
    for tp, loaded in loads.items():
        assert all(torch.equal(a, b) for pair, ref in zip(loaded, kv) for a, b in zip(pair, ref))
        logits, greedy = outputs[tp]
        assert (logits - expected_logits).abs().max().item() <= 1e-4
        assert greedy == expected_tokens
        assert torch.equal(logits, outputs[readers[0]][0])


def test_slot_bytes_do_not_depend_on_the_tp_size(setup: Any) -> None:
    _, identity, tokens, kv = setup
    keys = chunk_keys(tokens, identity)[:CHUNKS]
    written = {}
    for tp in (1, 2, 4):
        with make_manager(identity) as m:
            slots = store_as_ranks(m, kv, keys, tp)
            written[tp] = [bytes(m.region.view(slot)) for slot in slots]
    assert written[1] == written[2] == written[4]


def test_tp2_instance_shares_with_a_tp4_instance_through_the_filesystem(
    setup: Any, tmp_path: Path
) -> None:
    """Two instances of one model, TP=2 and TP=4, share chunks: one file per chunk."""
    model, identity, tokens, kv = setup
    keys = chunk_keys(tokens, identity)[:CHUNKS]
    fs = [{"type": "fs", "root_dir": str(tmp_path / "kv")}]
    with make_manager(identity, fs) as writer:
        store_as_ranks(writer, kv, keys, 2)
        assert writer.wait_idle(10)
    assert (
        len([p for p in (tmp_path / "kv").rglob("*") if p.is_file() and keys[0].hex() in p.name])
        == 1
    )
    with make_manager(identity, fs) as reader:
        assert settle(reader, keys) == CHUNKS
        logits, greedy = resume(model, load_as_ranks(reader, keys, 4), tokens)
    expected_logits, expected_tokens = recompute(model, tokens)
    assert (logits - expected_logits).abs().max().item() <= 1e-4 and greedy == expected_tokens


def settle(m: TieringManager, keys: list[Any], timeout: float = 30.0) -> int:
    """``m.lookup(keys)`` once it stops answering RETRY (the chunks are promoted from a tier)."""
    deadline = time.monotonic() + timeout
    while (ready := m.lookup(keys)) is RETRY:
        assert time.monotonic() < deadline, f"lookup still answered RETRY after {timeout} s"
        time.sleep(0.002)
    assert isinstance(ready, int)
    return ready


def owned_mask(layout: KVLayout, rank: int, tp_size: int) -> np.ndarray:
    """Bytes of a slot that ``rank`` writes, from ``rank_runs`` and the page offsets alone."""
    mask = np.zeros(layout.chunk_bytes, dtype=bool)
    for layer in layout.layers_of("full", "sliding"):
        for block in range(layout.blocks_per_chunk):
            for offset, length in layout.rank_runs(rank, tp_size):
                start = layout.page_offset(layer, block) + offset
                mask[start : start + length] = True
    for section in layout.sections:
        if section.kind != "attention" and layout.rank_writes(rank, tp_size, section.kind):
            mask[section.offset : section.offset + section.nbytes] = True
    return mask


HYBRID = KVLayout(
    3,
    4,
    8,
    "float32",
    block_size=4,
    blocks_per_chunk=2,
    groups=(
        LayerGroup("full", (0,)),
        LayerGroup("latent", (1,), latent_dims=(6, 2)),
        LayerGroup("state", (0, 2), state_shapes=((3, 4),)),
    ),
)


@pytest.mark.parametrize(
    "layout", [KVLayout(2, 4, 8, "float32", 4, 2), HYBRID], ids=["plain", "hybrid"]
)
@pytest.mark.parametrize("tp_size", [2, 4])
def test_a_rank_writes_exactly_its_runs(layout: KVLayout, tp_size: int) -> None:
    """Each rank's store changes only its K run and V run of each attention page (plus, on
    rank 0, the replicated latent and state pages); all ranks together write every byte."""
    region = HostRegion(1, layout.chunk_bytes, pin=False)
    covered = np.zeros(layout.chunk_bytes, dtype=bool)
    for rank in range(tp_size):
        engine = TransferEngine(layout, region, "cpu", tp_rank=rank, tp_size=tp_size)
        region.numpy(0)[:] = 0xAB
        chunk = torch.zeros((1, *chunk_shape(engine.local_layout)), dtype=engine.dtype)
        engine.wait(engine.submit_store(chunk, [0]))
        changed = region.numpy(0) != 0xAB
        assert np.array_equal(changed, owned_mask(layout, rank, tp_size))
        covered |= changed
    assert covered.all()


def test_heads_are_shared_out_or_replicated() -> None:
    layout = KVLayout(2, 4, 8, "float32", 4, 2)
    assert [layout.rank_heads(r, 2) for r in range(2)] == [range(0, 2), range(2, 4)]
    two = KVLayout(2, 2, 8, "float32", 4, 2)
    assert [layout.rank_heads(r, 4) for r in range(4)] == [range(r, r + 1) for r in range(4)]
    assert [two.rank_heads(r, 4) for r in range(4)] == [range(0, 1)] * 2 + [range(1, 2)] * 2
    assert [two.rank_writes(r, 4, "attention") for r in range(4)] == [True, False, True, False]
    assert layout.rank_runs(1, 2) == [
        (2 * layout.head_bytes, 2 * layout.head_bytes),
        (6 * layout.head_bytes, 2 * layout.head_bytes),
    ]
    with pytest.raises(ConfigError):
        KVLayout(2, 4, 8, "float32", 4, 2).rank_heads(0, 3)
