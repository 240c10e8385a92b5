"""Hybrid models serve cached prefixes with the logits and tokens of a recompute.

Sliding-window attention (Mistral), attention and Mamba2 state-space layers side by side
(GraniteMoeHybrid), layers that hold attention *and* a Mamba2 mixer (Falcon-H1) and latent
attention (DeepSeek-V3 MLA), each built from a tiny config. Every scenario compares with the model itself: prefill logits within 1e-4 (float32) of a
full recompute and the greedy tokens of ``model.generate``. Chunks are 8 tokens (2 blocks of 4).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers as hf

from kvtier import CacheIdentity
from kvtier.integrations.transformers import (
    DeviceChunkCache,
    TieredModel,
    identity_for,
    layout_for,
)

from .conftest import BLOCK_SIZE, BLOCKS_PER_CHUNK, manager, tier_config
from .test_transformers import assert_like_recompute, prompt, serve

SHAPE = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
MAMBA2 = {"mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_chunk_size": 8}
WINDOW = 12  # tokens a sliding-window query sees: resuming needs the last 11, i.e. 2 chunks

BUILDERS = {
    "mistral": lambda: hf.MistralForCausalLM(hf.MistralConfig(**SHAPE, sliding_window=WINDOW)),
    "granite_hybrid": lambda: hf.GraniteMoeHybridForCausalLM(hf.GraniteMoeHybridConfig(
        **SHAPE, **MAMBA2, layer_types=["linear_attention", "full_attention"],
        num_local_experts=2, num_experts_per_tok=1)),
    "falcon_h1": lambda: hf.FalconH1ForCausalLM(hf.FalconH1Config(
        **SHAPE, **MAMBA2, mamba_d_ssm=128)),
    "deepseek_v3": lambda: hf.DeepseekV3ForCausalLM(hf.DeepseekV3Config(
        **{**SHAPE, "num_key_value_heads": 4}, kv_lora_rank=32, q_lora_rank=None,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
        first_k_dense_replace=2, moe_intermediate_size=32)),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def hybrid(request: pytest.FixtureRequest) -> tuple[str, Any, CacheIdentity]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = BUILDERS[request.param]().eval()
    return (
        request.param,
        model,
        identity_for(model, layout_for(model, BLOCK_SIZE, BLOCKS_PER_CHUNK)),
    )


@pytest.fixture
def managers(hybrid: tuple[str, Any, CacheIdentity]) -> Any:
    built: list[Any] = []

    def make(host_slots: int, tiers: list[dict[str, Any]] | None = None) -> Any:
        built.append(manager(hybrid[2], host_slots, tiers or []))
        return built[-1]

    yield make
    for m in built:
        m.close()


def expected_sources(name: str, tokens: int, source: str, prefix_chunks: int) -> dict[str, int]:
    """A sliding-window model loads its last 2 chunks and skips the rest; others load them all."""
    if name != "mistral":
        return {
            "accelerator": 0,
            source: prefix_chunks * 8,
            "recomputed": tokens - prefix_chunks * 8,
        }
    skipped = (prefix_chunks - 2) * 8
    return {source: 16, "skipped": skipped, "recomputed": tokens - prefix_chunks * 8}


EXPECTED_GROUPS = {
    "mistral": [("sliding", (0, 1))],
    "granite_hybrid": [("full", (1,)), ("state", (0,))],
    "falcon_h1": [("full", (0, 1)), ("state", (0, 1))],
    "deepseek_v3": [("latent", (0, 1))],
}


def test_layouts_carry_every_layer_type(hybrid: tuple[str, Any, CacheIdentity]) -> None:
    name, _, identity = hybrid
    layout = identity.layout
    assert sorted((g.kind, g.layers) for g in layout.groups) == EXPECTED_GROUPS[name]
    assert layout.window_chunks == (2 if name == "mistral" else None)


def test_prefix_from_host(hybrid: tuple[str, Any, CacheIdentity], managers: Any) -> None:
    """A follow-up prompt resumes after 4 cached chunks and recomputes only the rest."""
    name, model, identity = hybrid
    tiered = TieredModel(model, identity, managers(host_slots=16))
    first = prompt(35, seed=1)
    serve(tiered, first)
    follow_up = first + prompt(9, seed=2)
    result = serve(tiered, follow_up)
    assert result.cached_tokens == 32
    assert result.sources == expected_sources(name, 44, "host", 4)
    assert_like_recompute(model, follow_up, result)


@pytest.mark.parametrize("prefetch", [False, True], ids=["on-demand", "prefetched"])
def test_prefix_from_the_filesystem(
    hybrid: tuple[str, Any, CacheIdentity], managers: Any, tmp_path: Path, prefetch: bool
) -> None:
    """A second instance with an empty host gets the prefix from the filesystem tier.

    ``prefetch`` first: what ``generate`` would load (a sliding-window model: its last 2
    chunks only) waits in host memory before the request, which takes it with one lookup
    (no ``RETRY``), still counted as the fs tier's."""
    name, model, identity = hybrid
    writer = TieredModel(model, identity, managers(4, [tier_config("fs", tmp_path)]))
    first = prompt(36, seed=3)
    serve(writer, first)
    reader_manager = managers(4, [tier_config("fs", tmp_path)])
    reader = TieredModel(model, identity, reader_manager)
    follow_up = first + prompt(5, seed=4)
    if prefetch:
        reader.prefetch(follow_up)
        assert reader_manager.wait_idle(20)
        reader_manager.poll()
        assert reader_manager.stats()["host"]["used_slots"] == (2 if name == "mistral" else 4)
    lookups = reader_manager.stats()["counters"].get("kvtier_lookups_total", 0)
    result = serve(reader, follow_up)
    assert result.sources == expected_sources(name, 41, reader_manager.tiers[0].name, 4)
    if prefetch:
        assert reader_manager.stats()["counters"]["kvtier_lookups_total"] == lookups + 1
    assert_like_recompute(model, follow_up, result)


def test_a_prefix_the_device_cache_holds_is_not_prefetched(
    hybrid: tuple[str, Any, CacheIdentity], managers: Any, tmp_path: Path
) -> None:
    """``generate`` would take it from the device cache without a lookup (a sliding-window
    model: its last window), so ``prefetch`` asks no tier either."""
    _, model, identity = hybrid
    manager = managers(4, [tier_config("fs", tmp_path)])
    tiered = TieredModel(model, identity, manager, device_cache=DeviceChunkCache(64))
    first = prompt(36, seed=9)
    serve(tiered, first)  # 39 tokens run: 4 full chunks, all in the device cache
    serve(tiered, prompt(36, seed=11))  # 4 more: the first 4 leave host (4 slots), not the device
    asked = tier_lookups(manager)
    tiered.prefetch(first + prompt(1, seed=10))  # a prefix of 4 chunks
    assert tier_lookups(manager) == asked
    tiered.prefetch(first + prompt(9, seed=10))  # 5 chunks: the 5th is asked for
    assert tier_lookups(manager) > asked


def tier_lookups(manager: Any) -> float:
    counters = manager.stats()["counters"]
    return sum(v for k, v in counters.items() if k.startswith("kvtier_tier_lookups_total"))


def test_a_chunk_completed_while_decoding_is_resumable(
    hybrid: tuple[str, Any, CacheIdentity], managers: Any
) -> None:
    """Chunk 3 ends at a generated token: its KV and its state come from the decode steps."""
    name, model, identity = hybrid
    tiered = TieredModel(model, identity, managers(host_slots=16))
    first = prompt(30, seed=5)
    generated = serve(tiered, first).tokens  # 30 + 3 tokens run: 4 full chunks stored
    follow_up = first + generated + prompt(4, seed=6)
    result = serve(tiered, follow_up)
    assert result.cached_tokens == 32
    assert result.sources == expected_sources(name, 38, "host", 4)
    assert_like_recompute(model, follow_up, result)


def test_a_sliding_window_reload_reads_only_the_window(tmp_path: Path) -> None:
    """Mistral resumes after 4 chunks from the last 2: half the prefix's bytes move, both from
    the filesystem into host and from host to the device, and the output is a recompute's."""
    torch.manual_seed(0)
    model = BUILDERS["mistral"]().eval()
    identity = identity_for(model, layout_for(model, BLOCK_SIZE, BLOCKS_PER_CHUNK))
    writer, reader = (manager(identity, 8, [tier_config("fs", tmp_path)]) for _ in range(2))
    try:
        first = prompt(36, seed=7)
        serve(TieredModel(model, identity, writer), first)
        follow_up = first + prompt(6, seed=8)
        result = serve(TieredModel(model, identity, reader), follow_up)
        counters = reader.stats()["counters"]
    finally:
        writer.close()
        reader.close()
    chunk = identity.layout.chunk_bytes
    assert result.cached_tokens == 32 and result.sources["skipped"] == 16
    assert counters[f"kvtier_tier_bytes_total{{op=load,tier={reader.tiers[0].name}}}"] == 2 * chunk
    assert counters["kvtier_transfer_bytes_total{direction=host_to_accelerator}"] == 2 * chunk
    assert_like_recompute(model, follow_up, result)
