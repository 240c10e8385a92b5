"""kvtier's keys in vLLM's ``kv_connector_extra_config``: honoured, or refused at engine start.

The runtime of a vLLM engine (``engine``) reads the keys of ``RuntimeConfig`` at the top of the
extra config, with the same names and checks as kvtier's own configuration:

* ``metrics_port``, ``metrics_host``, ``metrics_admin``: ``/metrics`` (kvtier's metric names)
  and the loopback admin endpoint, served from the engine core process;
* ``slo_guard``: the guard on promotion latency (``promotion_p99_s``), per kvtier tier;
* ``secondary_min_priority``: the retention floor of every kvtier tier (a tier entry's own
  ``secondary_min_priority`` overrides it);
* ``max_request_priority``, ``max_request_duration_s``: the operator's caps on what a request's
  ``kvtier_retention`` may ask for (``request_retention``), for kvtier's cache policy and the
  tiers' ``secondary_min_priority`` alike;
* ``tune_malloc``: glibc malloc's thresholds in the engine core process
  (``kvtier.core.malloc_settings``).

Keys of kvtier's configuration that cannot be honoured inside vLLM are refused with the key
named (``REFUSED``), so that no setting is ignored without a word. Keys that neither vLLM nor
kvtier reads are reported by ``unknown_keys`` (the engine logs them: vLLM's own set changes
between releases, so they are not refused).

Nothing here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtier.config.parser import parse_dataclass
from kvtier.config.schema import RUNTIME_KEYS, RuntimeConfig
from kvtier.errors import ConfigError

PATH = "kv_connector_extra_config"
MODULE = "kvtier.integrations.vllm"

#: The keys vLLM 0.32's offloading connector and specs read from the extra config.
VLLM_KEYS = frozenset(
    {
        "spec_name", "spec_module_path", "cpu_bytes_to_use", "eviction_policy",
        "cache_policy_module_path", "blocks_per_chunk", "block_size", "secondary_tiers",
        "offload_prompt_only", "backpressure", "canonical_layout", "enable_telemetry",
        "max_tracker_size", "self_describing_kv_events", "store_threshold",
    }
)  # fmt: skip

#: kvtier keys that cannot be honoured inside vLLM, and what to do instead.
REFUSED = {
    "admission": "kvtier's admission levels under vLLM are per tier: give a tier entry "
    "\"admission\": {...} (host memory is vLLM's; its store_threshold is vLLM's own key)",
    "serve": "a kvtier peer server is not run inside vLLM; run one beside it and use KvtierPeer",
    "kv_events": "vLLM publishes KV events itself: use vLLM's --kv-events-config",
    "trace_path": "the request trace is recorded by kvtier's manager only, not inside vLLM",
}

#: Request latencies vLLM does not hand to plugins in the engine core process.
_ENGINE_BLIND = ("ttft_p99_s", "itl_p99_s")


def engine_config(extra: Mapping[str, Any]) -> RuntimeConfig:
    """The runtime's settings in ``extra`` (vLLM's extra config); ``ConfigError`` naming the
    key for a bad value or a kvtier key that cannot be honoured inside vLLM."""
    if not isinstance(extra, Mapping):
        raise ConfigError(f"{PATH}: expected a JSON object")
    for key, why in REFUSED.items():
        if key in extra:
            raise ConfigError(f"{PATH}.{key}: not supported inside vLLM: {why}")
    fields = {key: extra[key] for key in RUNTIME_KEYS if key in extra}
    config: RuntimeConfig = parse_dataclass(RuntimeConfig, fields, PATH)
    guard = config.slo_guard
    for budget in _ENGINE_BLIND:
        if guard is not None and getattr(guard, budget) is not None:
            raise ConfigError(
                f"{PATH}.slo_guard.{budget}: vLLM gives request latencies to no plugin in its "
                "engine core process, where kvtier's tiers run; guard promotion_p99_s instead"
            )
    return config


def unknown_keys(extra: Mapping[str, Any]) -> list[str]:
    """Keys of ``extra`` that neither vLLM (``VLLM_KEYS``) nor kvtier reads, sorted."""
    return sorted(set(extra) - VLLM_KEYS - set(RUNTIME_KEYS))


def refuse_orphan_runtime_keys(extra: Any, tiers_run: bool) -> None:
    """``ConfigError`` naming a kvtier runtime key (``metrics_port``, ``slo_guard``, ...) given
    where no kvtier tier would run the runtime that honours it: a host-only spec, or no
    ``KvtierX`` entry among ``secondary_tiers``."""
    extra = extra if isinstance(extra, dict) else {}
    tiers = extra.get("secondary_tiers") if tiers_run else None
    ours = [
        t
        for t in tiers or []
        if isinstance(t, dict) and t.get("module_path") == "kvtier.integrations.vllm"
    ]
    given = [key for key in RUNTIME_KEYS if key in extra]
    if given and not ours:
        raise ConfigError(
            f"kv_connector_extra_config.{given[0]}: kvtier's runtime runs with kvtier's tiers; "
            'add a secondary_tiers entry with "module_path": "kvtier.integrations.vllm" '
            "(and a tiering spec), or remove the key"
        )
