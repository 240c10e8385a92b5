"""kvtier inside vLLM: kvtier's tiers as vLLM secondary tiers, and specs for vLLM's CPU platform.

In vLLM's ``--kv-transfer-config`` (``OffloadingConnector``)::

    "secondary_tiers": [{"type": "KvtierFs", "module_path": "kvtier.integrations.vllm",
                         "root_dir": "/kv"}]

Names (each loaded on first use, so ``import kvtier.integrations.vllm`` does not import vLLM;
using one needs vLLM installed):

* tiers (``tiers``): ``KvtierFs``, ``KvtierObj``, ``KvtierPeer`` (one per tier type
  registered with a vLLM shim in ``kvtier.tiers.catalog``), ``KvtierTier``;
* retention priority in vLLM's host memory (``priority_policy``): ``KvtierPriorityPolicy``,
  ``KvtierPriorityARCPolicy``, given as ``eviction_policy`` with ``cache_policy_module_path``;
  requests ask for it in ``kv_transfer_params["kvtier_retention"]`` (``request_retention``);
* specs for the CPU platform (``specs``): ``CPUTieringOffloadingSpec``,
  ``CPUHostOffloadingSpec``; the worker they use (``worker``): ``CPUHostWorker``;
* vLLM-free helpers: ``identity_from_config`` and ``KeyMap`` (``identity``), ``PrimaryRegion``
  (``region``).
"""

from __future__ import annotations

import importlib
from typing import Any

from kvtier.integrations.vllm.identity import KeyMap, identity_from_config
from kvtier.integrations.vllm.region import PrimaryRegion
from kvtier.tiers.catalog import TIER_TYPES

_SHIMS = [t.vllm.class_name for t in TIER_TYPES.values() if t.vllm is not None]
_LAZY = {
    **dict.fromkeys(["KvtierSecondaryTier", *_SHIMS, "KvtierTier"], "tiers"),
    "CPUTieringOffloadingSpec": "specs",
    "CPUHostOffloadingSpec": "specs",
    "CPUHostWorker": "worker",
    "KvtierPriorityPolicy": "priority_policy",
    "KvtierPriorityARCPolicy": "priority_policy",
}

__all__ = ["KeyMap", "PrimaryRegion", "identity_from_config", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
