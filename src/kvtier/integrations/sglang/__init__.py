"""kvtier inside SGLang: kvtier's fs, obj and peer tiers as HiCache's L3 storage backend.

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.integrations.sglang", "class_name": "KvtierHiCacheStorage",
        "interface_v1": 1, "kvtier": {"secondary_tiers": [{"type": "fs", "root_dir": "/kv"}]}}'

Names: ``KvtierHiCacheStorage`` (``storage``; loaded on first use, so importing this package
does not import SGLang), and the SGLang-free ``HiCacheBackend`` (``backend``) it is made of.
The manual: docs/sglang.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from kvtier.integrations.sglang.backend import HiCacheBackend

__all__ = ["HiCacheBackend", "KvtierHiCacheStorage"]


def __getattr__(name: str) -> Any:
    if name != "KvtierHiCacheStorage":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return importlib.import_module(f"{__name__}.storage").KvtierHiCacheStorage
