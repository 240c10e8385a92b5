"""The plan's recommendation as vLLM's ``--kv-transfer-config``, for the vLLM build it runs on.

``vllm_line(rec, analysis, fs_root, target, base)`` builds the JSON that starts the engine as
printed (``kvtier.integrations.vllm.check`` checks it before it is printed):

* the spec for ``target``: on ``vllm-cpu`` kvtier's ``CPUTieringOffloadingSpec`` (or
  ``CPUHostOffloadingSpec`` without tiers) from ``kvtier.integrations.vllm``, since vLLM's
  stock specs need CUDA; on ``vllm-cuda`` vLLM's ``TieringOffloadingSpec`` (``CPUOffloadingSpec``);
* ``cpu_bytes_to_use`` (already within the headroom and cap of the recommendation),
  ``block_size`` (the plan's chunk, rounded up to a multiple of the engine block),
  ``eviction_policy``;
* kvtier's tiers, never vLLM's own (whose ``fs`` takes no ``max_bytes``): the fs tier the plan
  sized as ``KvtierFs`` with ``root_dir`` and ``max_bytes``; the tiers of a ``base`` kvtier
  config as ``KvtierFs`` / ``KvtierObj`` / ``KvtierPeer`` (flat options) or ``KvtierTier``
  (the whole entry under ``"kvtier"``);
* second-use admission, where the plan recommends it: vLLM's ``store_threshold: 2`` with a
  host-only spec (the host-memory admission the plan simulated); with tiers, where vLLM's
  tiering specs refuse ``store_threshold``, each tier entry's ``"admission": {"min_reuse": 2}``;
* from ``base``, kvtier's runtime keys that work inside vLLM (``metrics_*``, ``slo_guard``
  without request-latency budgets, ``secondary_min_priority``); the keys that cannot are left
  out, each with a note.

``notes`` says what was translated or left out, for the report. Runs on the caller's thread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtier.plan.analysis import Analysis
from kvtier.plan.verdict import DONT_TIER, Recommendation

MODULE = "kvtier.integrations.vllm"
#: The second-use admission the plan simulates, as one kvtier admission entry.
SECOND_USE = {"min_reuse": 2}
_SPECS = {
    ("vllm-cpu", True): {"spec_name": "CPUTieringOffloadingSpec", "spec_module_path": MODULE},
    ("vllm-cpu", False): {"spec_name": "CPUHostOffloadingSpec", "spec_module_path": MODULE},
    ("vllm-cuda", True): {"spec_name": "TieringOffloadingSpec"},
    ("vllm-cuda", False): {"spec_name": "CPUOffloadingSpec"},
}
_CLASSES = {"fs": "KvtierFs", "obj": "KvtierObj", "p2p": "KvtierPeer"}
#: kvtier keys of a base config that work inside vLLM, at the top of the extra config.
_RUNTIME_KEYS = (
    "metrics_port", "metrics_host", "metrics_admin", "secondary_min_priority", "tune_malloc",
)  # fmt: skip
#: Keys of a base config the line sets itself (from the recommendation) or that are vLLM's.
_REPLACED = (
    "cpu_bytes_to_use", "block_size", "blocks_per_chunk", "eviction_policy", "secondary_tiers",
    "spec_name", "spec_module_path", "kv_connector", "kv_role", "store_threshold", "slo_guard",
)  # fmt: skip
_REQUEST_BUDGETS = ("ttft_p99_s", "itl_p99_s")


@dataclass
class VllmLine:
    """vLLM's ``--kv-transfer-config`` (``config``) and what the report should say of it."""

    config: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def vllm_line(
    rec: Recommendation,
    a: Analysis,
    fs_root: str,
    target: str,
    base: Mapping[str, Any] | None = None,
) -> VllmLine:
    """The recommendation as vLLM's JSON for ``target`` (``vllm-cpu`` or ``vllm-cuda``), with
    ``base`` (a kvtier config, whole or its extra config) carried over where vLLM allows."""
    inner = dict(base.get("kv_connector_extra_config", base)) if base else {}
    line = VllmLine({})
    tiers = _tiers(rec, fs_root, inner)
    extra: dict[str, Any] = {
        **_SPECS[(target, bool(tiers))],
        "cpu_bytes_to_use": rec.cpu_bytes_to_use,
        "block_size": _block_size(a, line.notes),
        "eviction_policy": rec.eviction_policy,
        **_runtime_keys(inner, line.notes),
    }
    if tiers:
        extra["secondary_tiers"] = tiers
    _admission(rec, extra, line.notes)
    if rec.verdict == DONT_TIER:
        line.notes.append("the verdict is don't tier: this is the host tier the plan sized")
    line.config = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }
    return line


def _tiers(rec: Recommendation, fs_root: str, inner: Mapping[str, Any]) -> list[dict[str, Any]]:
    """kvtier's tier entries: the sized fs tier first (a base config's fs entry keeps its
    options), then the base config's other tiers in their order."""
    base_tiers = [dict(t) for t in inner.get("secondary_tiers", [])]
    fs = [t for t in base_tiers if t.get("type") == "fs"]
    others = [t for t in base_tiers if t.get("type") != "fs"]
    entries = []
    if rec.fs_max_bytes is not None:
        sized = {**(fs[0] if fs else {"type": "fs", "root_dir": fs_root})}
        entries.append({**sized, "max_bytes": rec.fs_max_bytes})
    return [_vllm_entry(t) for t in entries + others]


def _vllm_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A kvtier tier entry as a vLLM ``secondary_tiers`` entry of kvtier's classes."""
    kind = entry.get("type")
    if kind in _CLASSES and "module_path" not in entry:
        options = {k: v for k, v in entry.items() if k != "type"}
        return {"type": _CLASSES[str(kind)], "module_path": MODULE, **options}
    return {"type": "KvtierTier", "module_path": MODULE, "kvtier": dict(entry)}


def _block_size(a: Analysis, notes: list[str]) -> int:
    tokens, block = a.chunk.chunk_tokens, a.options.engine_block_size
    rounded = -(-tokens // block) * block
    if rounded != tokens:
        notes.append(
            f"block_size {rounded}: the plan's {tokens}-token chunk rounded up to a multiple "
            f"of the engine block ({block} tokens), as vLLM requires"
        )
    return rounded


def _runtime_keys(inner: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """The base config's runtime keys that vLLM's extra config takes; a note for the rest."""
    from kvtier.integrations.vllm.engine_config import REFUSED

    kept = {k: inner[k] for k in _RUNTIME_KEYS if k in inner}
    guard = dict(inner.get("slo_guard") or {})
    dropped = [k for k in _REQUEST_BUDGETS if guard.pop(k, None) is not None]
    if dropped:
        notes.append(
            f"slo_guard: {', '.join(dropped)} left out (vLLM gives request "
            "latencies to no plugin in the engine core process)"
        )
    if guard.get("promotion_p99_s") is not None:
        kept["slo_guard"] = guard
    elif guard:
        notes.append("slo_guard left out: no promotion_p99_s budget is left under vLLM")
    for key in sorted(set(inner) - set(_RUNTIME_KEYS) - set(_REPLACED)):
        notes.append(f"{key} left out: {REFUSED.get(key, 'not read inside vLLM')}")
    return kept


def _admission(rec: Recommendation, extra: dict[str, Any], notes: list[str]) -> None:
    if rec.admission is None:
        return
    tiers = extra.get("secondary_tiers", [])
    if not tiers:
        extra["store_threshold"] = SECOND_USE["min_reuse"]
        notes.append(f"admission {rec.admission}: vLLM's store_threshold 2 (host memory)")
        return
    for entry in tiers:
        entry.setdefault("admission", dict(SECOND_USE))
    notes.append(
        f"admission {rec.admission}: each tier's \"admission\": {json.dumps(SECOND_USE)} (vLLM's "
        "tiering specs refuse host-memory admission, store_threshold; the prediction assumed it)"
    )
