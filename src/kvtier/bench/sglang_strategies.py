"""What ``kvtier bench --engine sglang`` compares: the pools and one SGLang server per strategy.

Strategies (each its own SGLang server, the same device KV pool except the ceiling's, the same
radix prefix cache on the device):

- ``recompute``: no HiCache; what the device pool does not hold is recomputed;
- ``sglang-file``: HiCache (SGLang's host pool as L2) with SGLang's own ``file`` L3 backend;
- ``kvtier-fs``: HiCache with kvtier as the L3 backend (``KvtierHiCacheStorage``, one fs tier);
- ``ceiling``: no HiCache, a device pool that holds every conversation (never evicts).

Both L3 strategies get the same host pool and the same prefetch settings (``PREFETCH``), with
SGLang's default write policy (``write_through``: every page reaches L3). Capacities are
counted in conversations at their longest (``tokens_per_conv``, whole ``PAGE_SIZE`` pages).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.bench.engine_bench import EngineBenchOptions, pool_sizes
from kvtier.bench.sglang_server import PAGE_SIZE

RECOMPUTE, SGLANG_FILE, KVTIER_FS, CEILING = "recompute", "sglang-file", "kvtier-fs", "ceiling"
STRATEGIES = (RECOMPUTE, SGLANG_FILE, KVTIER_FS, CEILING)
#: Strategies with an L3 directory: the L3 hit ratio is measured on them after the run.
L3_STRATEGIES = (SGLANG_FILE, KVTIER_FS)
#: SGLang's prefetch keys, the same for both L3 backends: a slow CPU needs more than SGLang's
#: default second before it revokes a prefetch (SGLang's threshold stays at 256 tokens).
PREFETCH = {"prefetch_timeout_base": 10}
PREFETCH_THRESHOLD = 256  # SGLang's default: a shorter L3 prefix is never asked for


@dataclass(frozen=True)
class Pools:
    """Capacities in tokens: a conversation, the device pool, the ceiling's pool, host memory."""

    tokens_per_conv: int
    device_tokens: int
    ceiling_tokens: int
    host_tokens: int

    @classmethod
    def size(cls, options: EngineBenchOptions) -> Pools:
        """``engine_bench.pool_sizes`` of ``options`` in whole pages, counted in tokens."""
        pages = math.ceil(options.max_context / PAGE_SIZE)
        sizes = (pages, *pool_sizes(pages, options))
        return cls(*(size * PAGE_SIZE for size in sizes))


def server_flags(strategy: str, pools: Pools, l3_dir: Path) -> list[str]:
    """SGLang's launch flags of a strategy beyond ``sglang_server.BASE_FLAGS``: the device
    pool (``--max-total-tokens``), the context length, and HiCache with its L3 backend."""
    tokens = pools.ceiling_tokens if strategy == CEILING else pools.device_tokens
    flags = ["--max-total-tokens", str(tokens), "--context-length", str(pools.tokens_per_conv)]
    if strategy not in L3_STRATEGIES:
        return flags
    ratio = pools.host_tokens / pools.device_tokens
    flags += ["--enable-hierarchical-cache", "--hicache-ratio", f"{ratio:.4f}"]
    if strategy == SGLANG_FILE:
        extra: dict[str, Any] = {"file_storage_path": str(l3_dir), **PREFETCH}
        return [*flags, "--hicache-storage-backend", "file", *_extra(extra)]
    tier = {"type": "fs", "root_dir": str(l3_dir)}
    extra = {
        "backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
        "class_name": "KvtierHiCacheStorage", "interface_v1": 1, **PREFETCH,
        "kvtier": {"secondary_tiers": [tier]},
    }  # fmt: skip
    return [*flags, "--hicache-storage-backend", "dynamic", *_extra(extra)]


def _extra(config: dict[str, Any]) -> list[str]:
    return ["--hicache-storage-backend-extra-config", json.dumps(config)]


def asked_from_l3(prompt_tokens: int, device: int, host: int) -> int:
    """The prompt tokens SGLang asks L3 for: whole pages past what L1 (``device``) and L2
    (``host``) matched, up to the prompt's last token (always computed), and none below
    ``PREFETCH_THRESHOLD`` (SGLang does not prefetch so little)."""
    asked = (prompt_tokens - 1 - device - host) // PAGE_SIZE * PAGE_SIZE
    return asked if asked >= PREFETCH_THRESHOLD else 0
