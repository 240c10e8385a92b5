"""What ``kvtier bench --engine vllm`` compares: the model, the pools, and one engine per strategy.

Strategies (each its own vLLM engine, the same device KV pool except the ceiling's):

- ``recompute``: no connector; what the device pool does not hold is recomputed;
- ``vllm-host``: vLLM's offloading connector with host memory only;
- ``vllm-fs``: vLLM's tiering, host memory and vLLM's own ``fs`` tier;
- ``kvtier-fs``: vLLM's tiering, host memory and kvtier's ``KvtierFs`` tier;
- ``ceiling``: no connector, a device pool that holds every conversation (never evicts);
- ``kvtier-fs-ops`` (only when asked for): ``kvtier-fs`` with kvtier's operator plane on:
  ``/metrics`` and the admin endpoint on a loopback ``metrics_port`` and an SLO guard whose
  promotion budget (``OPS_SLO_GUARD``) never trips, to measure what the plane costs.

Every connector offloads generated tokens too (``offload_prompt_only: false``) with one engine
block per chunk. Capacities are counted in conversations at their longest (``blocks_per_conv``
engine blocks of ``BLOCK_TOKENS``), as in the transformers bench.
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.bench.engine_bench import EngineBenchOptions, pool_sizes

RECOMPUTE, VLLM_HOST, VLLM_FS, KVTIER_FS, CEILING, KVTIER_FS_OPS = (
    "recompute", "vllm-host", "vllm-fs", "kvtier-fs", "ceiling", "kvtier-fs-ops",
)  # fmt: skip
#: What runs when no strategies are given; ``SELECTABLE`` adds the opt-in ones.
STRATEGIES = (RECOMPUTE, VLLM_HOST, VLLM_FS, KVTIER_FS, CEILING)
SELECTABLE = (*STRATEGIES, KVTIER_FS_OPS)
#: Strategies with a kvtier ``KvtierFs`` directory (and ``disk_dirs`` to measure).
FS_STRATEGIES = (VLLM_FS, KVTIER_FS, KVTIER_FS_OPS)
#: ``kvtier-fs-ops``' SLO guard: a promotion p99 budget of a minute, which no promotion nears.
OPS_SLO_GUARD = {"promotion_p99_s": 60}
MODULE = "kvtier.integrations.vllm"
BLOCK_TOKENS = 128  # vLLM's block size on the CPU platform

#: Llama-shaped models with random weights (``load_format="dummy"``): layers, hidden, KV heads.
MODEL_PRESETS = {"tiny": (2, 256, 2), "small": (4, 512, 4)}
HEAD_DIM = 64
VOCAB = 4096


def preset_config(name: str) -> dict[str, Any]:
    """The ``config.json`` of a preset: float32, head_dim 64, 4096 tokens, 8192 positions."""
    layers, hidden, kv_heads = MODEL_PRESETS[name]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // HEAD_DIM,
        "num_key_value_heads": kv_heads,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    }


@dataclass(frozen=True)
class Model:
    """A model directory as the engines load it; ``dummy``: random weights from its config."""

    path: Path
    dummy: bool
    config: dict[str, Any]

    @classmethod
    def resolve(cls, name: str, workdir: Path) -> Model:
        """A preset written as a config-only directory under ``workdir`` (its identity is its
        config: ``kvtier.model_fingerprint``), or a model directory; ``path`` is absolute either
        way (the runners run in their own work directory)."""
        if name in MODEL_PRESETS:
            path = Path(os.path.abspath(workdir / f"model-{name}"))
            path.mkdir(parents=True, exist_ok=True)
            (path / "config.json").write_text(json.dumps(preset_config(name), indent=1))
            return cls(path, True, preset_config(name))
        path = Path(os.path.abspath(name))
        return cls(path, False, json.loads((path / "config.json").read_text()))

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def block_bytes(self) -> int:
        """KV bytes of one engine block (all layers, K and V, float32)."""
        c: dict[str, int] = self.config
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * head_dim * 4 * BLOCK_TOKENS


@dataclass(frozen=True)
class Pools:
    """Capacities in engine blocks: the device pool, the ceiling's pool, host memory."""

    blocks_per_conv: int
    device_blocks: int
    ceiling_blocks: int
    host_blocks: int

    @classmethod
    def size(cls, options: EngineBenchOptions) -> Pools:
        """``engine_bench.pool_sizes`` of ``options`` in engine blocks."""
        per_conv = math.ceil(options.max_context / BLOCK_TOKENS)
        return cls(per_conv, *pool_sizes(per_conv, options))


def transfer_config(
    strategy: str, engine_id: str, host_bytes: int, fs_dir: Path, metrics_port: int | None = None
) -> Any:
    """vLLM's ``kv_transfer_config`` of a strategy (``None``: no connector); ``metrics_port``:
    where ``kvtier-fs-ops`` serves its operator plane (required for it, unused otherwise)."""
    if strategy in (RECOMPUTE, CEILING):
        return None
    extra: dict[str, Any] = {
        "spec_module_path": MODULE,
        "cpu_bytes_to_use": host_bytes,
        "blocks_per_chunk": 1,
        "offload_prompt_only": False,
    }
    if strategy == VLLM_HOST:
        extra["spec_name"] = "CPUHostOffloadingSpec"
    else:
        tier: dict[str, Any] = {"type": "fs", "root_dir": str(fs_dir)}
        if strategy in (KVTIER_FS, KVTIER_FS_OPS):
            tier = {"type": "KvtierFs", "module_path": MODULE, "root_dir": str(fs_dir)}
        extra |= {"spec_name": "CPUTieringOffloadingSpec", "secondary_tiers": [tier]}
    if strategy == KVTIER_FS_OPS:
        extra |= operator_plane(metrics_port)
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "engine_id": engine_id,
        "kv_connector_extra_config": extra,
    }


def operator_plane(metrics_port: int | None) -> dict[str, Any]:
    """kvtier's runtime keys of ``kvtier-fs-ops``: ``/metrics`` and the admin endpoint on
    ``127.0.0.1:metrics_port`` (the default host), and the guard of ``OPS_SLO_GUARD``."""
    if metrics_port is None:
        raise ValueError(f"{KVTIER_FS_OPS} needs a metrics_port")
    return {"metrics_port": metrics_port, "metrics_admin": True, "slo_guard": dict(OPS_SLO_GUARD)}


def free_port() -> int:
    """A loopback port free now, below the ephemeral range (no client's outgoing connection
    takes it while the engine starts)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20_000, 32_000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port from 20000 to 32000")
