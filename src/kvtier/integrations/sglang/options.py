"""kvtier's keys in SGLang's ``--hicache-storage-backend-extra-config``, checked as everywhere.

SGLang hands the whole extra config to the backend; kvtier reads one key of it, ``kvtier``::

    {"backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
     "class_name": "KvtierHiCacheStorage", "interface_v1": 1,
     "kvtier": {"secondary_tiers": [{"type": "fs", "root_dir": "/mnt/nvme/kv"}],
                "metrics_port": 9400, "metrics_admin": true}}

Inside ``kvtier``: ``secondary_tiers`` (kvtier's own tier entries: ``fs``, ``obj``, ``p2p``,
``module_path`` tiers; required), the runtime's keys (``metrics_port``, ``metrics_host``,
``metrics_admin``, ``slo_guard`` on ``promotion_p99_s``, ``admission`` with ``level`` naming a
tier, ``secondary_min_priority``, ``deadlines``), ``revision`` (part of the cache identity),
``kv_events`` (kvtier's publisher, in vLLM's wire format with SGLang's page hashes) and
``integrity_key_file``. Every value goes through kvtier's parser: a bad one raises
``ConfigError`` naming the key (for example, secondary_tiers[0].max_bytes under kvtier),
which fails the attach. Keys that cannot act under SGLang are refused with the reason
(``REFUSED``).

Nothing here imports SGLang.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtier.config.integrity import resolve_keys
from kvtier.config.parser import parse_dataclass, parse_tier
from kvtier.config.schema import RUNTIME_KEYS, KVEventsConfig, RuntimeConfig
from kvtier.errors import ConfigError
from kvtier.tiers.base import TierConfig

PATH = "kvtier"
#: SGLang's own keys of the extra config (the ones it pops, and the dynamic loader's).
SGLANG_KEYS = frozenset(
    {"backend_name", "module_path", "class_name", "interface_v1", "prefetch_threshold",
     "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
     "hicache_storage_pass_prefix_keys", "tp_lcm_size"}
)  # fmt: skip
#: kvtier keys that cannot act inside SGLang, and why.
REFUSED = {
    "cpu_bytes_to_use": "host memory is SGLang's own (--hicache-size / --hicache-ratio)",
    "serve": "a kvtier peer server is not run inside SGLang; run one beside it",
    "trace_path": "the request trace is recorded by kvtier's manager only",
    "max_request_priority": "SGLang requests carry no kvtier_retention",
    "max_request_duration_s": "SGLang requests carry no kvtier_retention",
}
_OWN = ("secondary_tiers", "revision", "kv_events", "integrity_key_file")
_ENGINE_BLIND = ("ttft_p99_s", "itl_p99_s")


@dataclass(frozen=True)
class BackendOptions:
    """What the ``kvtier`` key asks for: the tiers, the runtime's settings and the rest."""

    tiers: tuple[TierConfig, ...]
    runtime: RuntimeConfig
    revision: str = ""
    kv_events: KVEventsConfig | None = None
    zero_copy: bool = True


def backend_options(extra: Mapping[str, Any] | None) -> BackendOptions:
    """The options in SGLang's extra config; ``ConfigError`` naming the key for a bad one."""
    extra = extra or {}
    own = extra.get(PATH)
    if not isinstance(own, Mapping):
        raise ConfigError(
            f'{PATH}: required, an object such as {{"secondary_tiers": [{{"type": "fs", '
            '"root_dir": "/mnt/nvme/kv"}]}'
        )
    _refuse(own)
    runtime = _runtime(own)
    tiers = _tiers(own.get("secondary_tiers"))
    tiers, _ = resolve_keys(_key_file(own), tiers, None)
    revision = own.get("revision", "")
    if not isinstance(revision, str):
        raise ConfigError(f"{PATH}.revision: expected a string, got {revision!r}")
    events = own.get("kv_events")
    kv_events = None if events is None else _events(events)
    return BackendOptions(tiers, runtime, revision, kv_events, bool(extra.get("interface_v1")))


def _refuse(own: Mapping[str, Any]) -> None:
    for key, why in REFUSED.items():
        if key in own:
            raise ConfigError(f"{PATH}.{key}: not supported inside SGLang: {why}")
    unknown = sorted(set(own) - set(RUNTIME_KEYS) - set(_OWN))
    if unknown:
        raise ConfigError(f"{PATH}.{unknown[0]}: unknown key")


def _runtime(own: Mapping[str, Any]) -> RuntimeConfig:
    fields = {key: own[key] for key in RUNTIME_KEYS if key in own}
    config: RuntimeConfig = parse_dataclass(RuntimeConfig, fields, PATH)
    for budget in _ENGINE_BLIND:
        if config.slo_guard is not None and getattr(config.slo_guard, budget) is not None:
            raise ConfigError(
                f"{PATH}.slo_guard.{budget}: SGLang gives request latencies to no storage "
                "backend; guard promotion_p99_s instead"
            )
    return config


def _tiers(entries: Any) -> tuple[TierConfig, ...]:
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            f"{PATH}.secondary_tiers: required, a list of kvtier tier entries such as "
            '[{"type": "fs", "root_dir": "/mnt/nvme/kv"}]'
        )
    return tuple(parse_tier(e, f"{PATH}.secondary_tiers[{i}]") for i, e in enumerate(entries))


def _key_file(own: Mapping[str, Any]) -> str | None:
    value = own.get("integrity_key_file")
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{PATH}.integrity_key_file: expected a path")
    return value


def _events(entry: Any) -> KVEventsConfig:
    if not isinstance(entry, Mapping):
        raise ConfigError(f'{PATH}.kv_events: expected an object such as {{"endpoint": ...}}')
    config: KVEventsConfig = parse_dataclass(KVEventsConfig, entry, f"{PATH}.kv_events")
    return config
