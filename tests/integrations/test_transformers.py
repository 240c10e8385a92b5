"""The transformers integration serves cached prefixes with the logits and tokens of a recompute.

Every scenario compares against the model itself: prefill logits of the positions the tiered
model ran on (max abs difference <= 1e-4 in float32) and greedy tokens of ``model.generate``.
Chunks are 8 tokens (2 blocks of 4).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kvtier import CacheIdentity, ConfigError
from kvtier.integrations import transformers as transformers_integration
from kvtier.integrations.transformers import (
    DeviceChunkCache,
    Generation,
    TieredModel,
    identity_for,
    layout_for,
)
from kvtier.keys import ChunkKey, chunk_keys
from kvtier.telemetry.kv_events import EventKind

from .conftest import BLOCK_SIZE, BLOCKS_PER_CHUNK, build_model, tier_config

NEW_TOKENS = 4


def prompt(length: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (length,), generator=gen).tolist()


def assert_like_recompute(model: Any, tokens: list[int], result: Generation) -> None:
    ids = torch.tensor([tokens])
    with torch.inference_mode():
        full = model(input_ids=ids).logits[0, result.cached_tokens :]
        expected = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    assert result.logits.shape == full.shape
    assert (result.logits - full).abs().max().item() <= 1e-4
    assert result.tokens == expected[0, len(tokens) :].tolist()


def serve(tiered: TieredModel, tokens: list[int]) -> Generation:
    result = tiered.generate(tokens, NEW_TOKENS)
    tiered.flush()
    assert tiered.manager is not None
    assert tiered.manager.wait_idle(10)
    return result


def test_prefix_from_host(model: Any, identity: CacheIdentity, make_manager: Any) -> None:
    """A follow-up prompt gets its first 4 chunks from host and recomputes only the rest."""
    tiered = TieredModel(model, identity, make_manager(host_slots=16))
    first = prompt(35, seed=1)
    assert serve(tiered, first).sources == {"accelerator": 0, "recomputed": 35}
    follow_up = first + prompt(9, seed=2)
    result = serve(tiered, follow_up)
    assert result.cached_tokens == 32
    assert result.sources == {"accelerator": 0, "host": 32, "recomputed": 12}
    assert_like_recompute(model, follow_up, result)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of each token list the integration hashes into chunk keys, in order."""
    hashed: list[int] = []

    def counted(tokens: Any, *args: Any, **kwargs: Any) -> list[ChunkKey]:
        hashed.append(len(tokens))
        return chunk_keys(tokens, *args, **kwargs)

    monkeypatch.setattr(transformers_integration, "chunk_keys", counted)
    return hashed


def test_a_prefetched_prompt_is_keyed_once_and_only_for_itself(
    model: Any, identity: CacheIdentity, make_manager: Any, calls: list[int]
) -> None:
    """``generate`` takes the keys ``prefetch`` computed for the same prompt (one hashing
    fewer), also when it serves another prompt in between (a serving loop prefetches the
    request after the one it runs), and never those of another prompt: that would restore
    another prefix's KV."""
    tiered = TieredModel(model, identity, make_manager(host_slots=16))
    first = prompt(35, seed=1)
    serve(tiered, first)
    follow_up = first + prompt(9, seed=2)
    tiered.prefetch(follow_up)
    other = prompt(44, seed=5)
    result = serve(tiered, other)
    assert result.sources == {"accelerator": 0, "recomputed": 44}
    assert_like_recompute(model, other, result)
    calls.clear()
    result = serve(tiered, follow_up)
    assert calls == [len(follow_up) + NEW_TOKENS - 1], "only the store keys the reply"
    assert result.sources == {"accelerator": 0, "host": 32, "recomputed": 12}
    assert_like_recompute(model, follow_up, result)


def test_prefetch_keeps_the_keys_of_its_last_few_prompts_only(
    model: Any, identity: CacheIdentity, make_manager: Any, calls: list[int]
) -> None:
    """The keys of prompts prefetched but never served are dropped, the oldest first: memory
    stays bounded however many prompts a loop prefetches."""
    tiered = TieredModel(model, identity, make_manager(host_slots=16))
    prompts = [prompt(33 + i, seed=10 + i) for i in range(transformers_integration._PREFETCHED + 1)]
    for each in prompts:
        tiered.prefetch(each)
    for each, keyed_again in ((prompts[0], True), (prompts[1], False), (prompts[-1], False)):
        calls.clear()
        serve(tiered, each)
        store_only = [len(each) + NEW_TOKENS - 1]
        assert calls == ([len(each)] if keyed_again else []) + store_only


@pytest.mark.parametrize("tier", ["memory", "fs"])
def test_prefix_from_a_secondary_tier(
    model: Any, identity: CacheIdentity, make_manager: Any, tier: str, tmp_path: Path
) -> None:
    """Host evicted the prefix; it comes back from the tier (promoted into host) intact."""
    m = make_manager(host_slots=5, tiers=[tier_config(tier, tmp_path)])
    tiered = TieredModel(model, identity, m)
    first = prompt(44, seed=3)  # 5 chunks with the generated tokens
    serve(tiered, first)
    serve(tiered, prompt(40, seed=4))  # 5 other chunks push the first prompt's out of host
    follow_up = first + prompt(3, seed=5)
    result = serve(tiered, follow_up)
    assert result.sources == {"accelerator": 0, m.tiers[0].name: 40, "recomputed": 7}
    assert_like_recompute(model, follow_up, result)


def test_the_adapter_keeps_no_copy_of_the_managers_events(
    model: Any, identity: CacheIdentity, make_manager: Any, tmp_path: Path
) -> None:
    """Attributing promoted chunks takes no events: the manager's (bounded) log keeps them for
    whoever reads it, and the adapter holds none of its own however long it serves."""
    m = make_manager(host_slots=5, tiers=[tier_config("memory", tmp_path)])
    tiered = TieredModel(model, identity, m)
    first = prompt(44, seed=3)
    serve(tiered, first)
    serve(tiered, prompt(40, seed=4))  # pushes the first prompt's chunks out of host
    result = serve(tiered, first + prompt(3, seed=5))
    assert result.sources[m.tiers[0].name] == 40
    promoted = [e.key for e in m.take_events() if e.kind is EventKind.PROMOTED]
    assert promoted[:5] == chunk_keys(first, identity)[:5]
    assert tiered.take_events() == []


def with_head_evicted(tiered: TieredModel, identity: CacheIdentity, filler: int) -> list[int]:
    """Serve a prompt of 4 chunks (with 3 generated tokens), then a ``filler``-token one that
    fills host memory and one that evicts chunks 0-1 of the first (2-3 stay); returns it."""
    assert tiered.manager is not None
    first = prompt(32, seed=6)
    serve(tiered, first)
    serve(tiered, prompt(filler, seed=7))
    tiered.manager.touch(chunk_keys(first, identity)[2:4])  # 0-1: the least recently used
    serve(tiered, prompt(14, seed=8))  # 2 chunks
    return first


@pytest.mark.parametrize("tier", ["memory", "fs"])
def test_prefix_from_host_and_tier_mixed(
    model: Any, identity: CacheIdentity, make_manager: Any, tier: str, tmp_path: Path
) -> None:
    """Chunks 0-1 were evicted from host and come from the tier; chunks 2-3 are still in host."""
    m = make_manager(host_slots=6, tiers=[tier_config(tier, tmp_path)])
    tiered = TieredModel(model, identity, m)
    first = with_head_evicted(tiered, identity, filler=14)
    follow_up = first + prompt(8, seed=9)
    result = serve(tiered, follow_up)
    assert result.sources == {"accelerator": 0, m.tiers[0].name: 16, "host": 16, "recomputed": 8}
    assert_like_recompute(model, follow_up, result)


def test_a_store_around_chunks_still_in_host_fills_each_slot_with_its_own_chunk(
    model: Any, identity: CacheIdentity, make_manager: Any
) -> None:
    """Chunks 0-1 left host, chunks 2-3 stayed: the recomputed request stores chunks 0, 1 and
    its new tail (not one run of rows), and a later request restores each of them intact."""
    tiered = TieredModel(model, identity, make_manager(host_slots=8))
    first = with_head_evicted(tiered, identity, filler=30)
    second = first + prompt(13, seed=9)  # 45 tokens; 48 stored with the generated ones
    assert serve(tiered, second).sources["recomputed"] == len(second)
    third = second + prompt(5, seed=10)  # shares 5 whole chunks with what was stored
    result = serve(tiered, third)
    assert result.sources == {"accelerator": 0, "host": 40, "recomputed": len(third) - 40}
    assert_like_recompute(model, third, result)


def test_prefix_from_device_cache_and_host(
    model: Any, identity: CacheIdentity, make_manager: Any
) -> None:
    """The device cache kept chunks 0-1; chunks 2-3 come from host."""
    device = DeviceChunkCache(capacity=4)
    tiered = TieredModel(model, identity, make_manager(host_slots=16), device_cache=device)
    first = prompt(32, seed=10)
    serve(tiered, first)
    device.get(chunk_keys(first, identity)[:2])  # chunks 2-3 become the least recently used
    serve(tiered, prompt(14, seed=11))
    follow_up = first + prompt(5, seed=12)
    result = serve(tiered, follow_up)
    assert result.sources == {"accelerator": 16, "host": 16, "recomputed": 5}
    assert_like_recompute(model, follow_up, result)


@pytest.mark.parametrize(("policy", "kept"), [("arc", 24), ("lru", 0)])
def test_arc_keeps_a_reused_conversation_through_one_shot_prompts(
    model: Any, identity: CacheIdentity, make_manager: Any, policy: str, kept: int
) -> None:
    """6 host slots: a conversation's 3 chunks are reused once, then 6 chunks of one-shot
    prompts pass through. ARC keeps the reused chunks (storing a sequence orders its chunks
    without counting as a second use of the new ones); LRU loses them."""
    tiered = TieredModel(model, identity, make_manager(host_slots=6, policy=policy))
    conversation = prompt(24, seed=30)
    serve(tiered, conversation)
    assert serve(tiered, conversation + prompt(3, seed=31)).sources["host"] == 24
    for seed in (32, 33):
        serve(tiered, prompt(24, seed=seed))
    follow_up = conversation + prompt(5, seed=34)
    result = serve(tiered, follow_up)
    assert result.sources.get("host", 0) == kept
    assert_like_recompute(model, follow_up, result)


def test_a_failing_tier_means_recompute(
    model: Any, identity: CacheIdentity, make_manager: Any, tmp_path: Path
) -> None:
    """A tier whose loads fail costs a recompute, never wrong KV, and never hangs."""
    m = make_manager(host_slots=5, tiers=[tier_config("failing", tmp_path)])
    tiered = TieredModel(model, identity, m, retry_timeout_s=2.0)
    first = prompt(44, seed=13)
    serve(tiered, first)
    serve(tiered, prompt(40, seed=14))
    follow_up = first + prompt(3, seed=15)
    result = serve(tiered, follow_up)
    assert result.sources == {"accelerator": 0, "recomputed": 47}
    assert_like_recompute(model, follow_up, result)


def test_a_whole_cached_prompt_still_runs_its_last_chunk(
    model: Any, identity: CacheIdentity, make_manager: Any
) -> None:
    """A prompt of exactly 4 cached chunks restores 3 and feeds the model the last 8 tokens."""
    tiered = TieredModel(model, identity, make_manager(host_slots=16))
    tokens = prompt(32, seed=16)
    serve(tiered, tokens)
    result = serve(tiered, tokens)
    assert result.sources == {"accelerator": 0, "host": 24, "recomputed": 8}
    assert_like_recompute(model, tokens, result)


def test_device_cache_only_without_a_manager(model: Any, identity: CacheIdentity) -> None:
    tiered = TieredModel(model, identity, device_cache=DeviceChunkCache(None))
    first = prompt(20, seed=17)
    tiered.generate(first, NEW_TOKENS)
    follow_up = first + prompt(6, seed=18)
    result = tiered.generate(follow_up, NEW_TOKENS)
    assert result.sources == {"accelerator": 16, "recomputed": 10}
    assert_like_recompute(model, follow_up, result)


def test_identity_follows_the_weights() -> None:
    """Same config, other weights: another identity, so no cache is ever shared by mistake."""
    a, b = build_model("llama", seed=0), build_model("llama", seed=1)
    layout = layout_for(a, BLOCK_SIZE, BLOCKS_PER_CHUNK)
    assert identity_for(a, layout).digest == identity_for(build_model("llama", 0), layout).digest
    assert identity_for(a, layout).digest != identity_for(b, layout).digest


def test_identity_does_not_follow_the_path(tmp_path) -> None:
    """The same weights loaded from two paths share an identity; the path is only displayed."""
    a, b = build_model("llama", seed=0), build_model("llama", seed=0)
    a.config.name_or_path, b.config.name_or_path = "/mnt/a/m", str(tmp_path)
    layout = layout_for(a, BLOCK_SIZE, BLOCKS_PER_CHUNK)
    first, second = identity_for(a, layout), identity_for(b, layout)
    assert (first.model, second.model) == ("/mnt/a/m", tmp_path.name)
    assert first.digest == second.digest


def test_sliding_window_layers_get_their_own_group() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=16,
        max_window_layers=1,
    )
    layout = layout_for(Qwen2ForCausalLM(config), BLOCK_SIZE, BLOCKS_PER_CHUNK)
    assert [(g.kind, g.layers, g.window) for g in layout.groups] == [
        ("full", (0,), 0),
        ("sliding", (1,), 16),
    ]
    assert layout.window_chunks is None  # the full-attention layer needs the whole prefix


def test_unsupported_layer_types_are_refused() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_chunk_size=16,
    )
    with pytest.raises(ConfigError, match="chunked_attention"):
        layout_for(LlamaForCausalLM(config), BLOCK_SIZE, BLOCKS_PER_CHUNK)


def test_a_manager_of_another_identity_is_refused(model: Any, make_manager: Any) -> None:
    other = identity_for(build_model("llama", seed=5), layout_for(model, BLOCK_SIZE, 2))
    with pytest.raises(ConfigError):
        TieredModel(model, other, make_manager(host_slots=4))


def test_device_cache_evicts_a_tail_before_its_prefix(identity: CacheIdentity) -> None:
    """Capacity 3, a 4-chunk sequence: its last chunk goes, so its 3-chunk prefix still hits."""
    keys = chunk_keys(prompt(32, seed=19), identity)
    device = DeviceChunkCache(capacity=3)
    device.put(keys, [torch.full((1,), float(i)) for i in range(4)])
    assert device.match(keys) == 3 and device.num_evicted == 1
    assert [float(c) for c in device.get(keys[:3])] == [0.0, 1.0, 2.0]
    assert DeviceChunkCache(capacity=0).match(keys) == 0


def test_decoding_stops_after_a_stop_token(model: Any, identity: CacheIdentity) -> None:
    tiered = TieredModel(model, identity)
    tokens = prompt(12, seed=20)
    free = tiered.generate(tokens, 6).tokens
    assert (
        tiered.generate(tokens, 6, stop_tokens={free[2]}).tokens == free[: free.index(free[2]) + 1]
    )
