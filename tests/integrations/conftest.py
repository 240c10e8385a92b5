"""Tiny causal LMs built from configs (random weights, nothing downloaded) and their managers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from kvtier import CacheIdentity, TieringConfig, TieringManager
from kvtier.integrations.transformers import identity_for, layout_for
from kvtier.region import ALIGNMENT, round_up

SHAPE = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
BLOCK_SIZE, BLOCKS_PER_CHUNK = 4, 2  # 8 tokens per chunk


def build_model(kind: str, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**SHAPE)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**SHAPE)).eval()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request: pytest.FixtureRequest) -> Any:
    torch.set_num_threads(1)
    return build_model(request.param)


@pytest.fixture(scope="module")
def identity(model: Any) -> CacheIdentity:
    return identity_for(model, layout_for(model, BLOCK_SIZE, BLOCKS_PER_CHUNK))


def tier_config(kind: str, root: Path) -> dict[str, Any]:
    if kind == "fs":
        return {
            "type": "fs",
            "root_dir": str(root / "kv"),
            "n_read_threads": 2,
            "n_write_threads": 2,
        }
    if kind == "failing":
        return {"type": "fault", "inner": {"type": "memory"}, "fail_load": True}
    return {"type": kind}


def manager(
    identity: CacheIdentity, host_slots: int, tiers: list[dict[str, Any]], policy: str = "lru"
) -> TieringManager:
    stride = round_up(identity.layout.chunk_bytes, ALIGNMENT)
    config = {
        "cpu_bytes_to_use": host_slots * stride,
        "secondary_tiers": tiers,
        "eviction_policy": policy,
    }
    return TieringManager(TieringConfig.from_dict(config), identity)


@pytest.fixture
def make_manager(identity: CacheIdentity) -> Iterator[Any]:
    built: list[TieringManager] = []

    def make(
        host_slots: int, tiers: list[dict[str, Any]] | None = None, policy: str = "lru"
    ) -> TieringManager:
        built.append(manager(identity, host_slots, tiers or [], policy))
        return built[-1]

    yield make
    for m in built:
        m.close()
