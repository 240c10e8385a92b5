"""The flat options of a vLLM ``secondary_tiers`` entry, checked by kvtier's own parser.

A vLLM user writes ``{"type": "KvtierFs", "module_path": "kvtier.integrations.vllm",
"root_dir": "/kv", "max_bytes": ...}``. vLLM takes ``type``, ``module_path`` and
``backpressure`` for itself and passes every other key to the tier's constructor. The adapter
keeps its own keys (``ADAPTER_OPTIONS``) and hands the rest to ``kvtier.config.parser`` as a
tier of the class's kind, so unknown keys, wrong types and impossible values raise
``ConfigError`` naming the key, e.g. ``KvtierFs.max_bytes: expected a positive integer``.
``KvtierTier`` takes one key, ``kvtier``: a whole kvtier tier entry (``module_path`` tiers too).
A tier's ``admission`` is one kvtier admission entry without ``level`` (``admission_config``):
the level is the tier itself.

Nothing here imports vLLM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kvtier.config.parser import parse_tier
from kvtier.control.admission import AdmissionConfig
from kvtier.errors import ConfigError
from kvtier.integrations.common.tier_fit import fit_to_rows
from kvtier.integrations.vllm.region import PrimaryRegion
from kvtier.policies.priority import checked_priority
from kvtier.tiers.base import TierConfig

#: Keys of the entry the adapter reads itself (not passed to the kvtier tier).
ADAPTER_OPTIONS = (
    "locality",
    "enable_kv_events",
    "revision",
    "secondary_min_priority",
    "admission",
)


def tier_config(kind: str | None, options: Mapping[str, Any], path: str) -> TierConfig:
    """The kvtier config of a tier of ``kind`` (``None``: the nested ``kvtier`` entry)."""
    if kind is not None:
        return parse_tier({**options, "type": kind}, path)
    unknown = sorted(set(options) - {"kvtier"})
    if unknown:
        raise ConfigError(f'{path}.{unknown[0]}: unknown key (put the tier under "kvtier")')
    nested = options.get("kvtier")
    if not isinstance(nested, Mapping):
        raise ConfigError(f'{path}.kvtier: required, a kvtier tier entry such as {{"type": "fs"}}')
    return parse_tier(nested, f"{path}.kvtier")


def adapter_options(options: Mapping[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split the entry into (the adapter's own options, the tier's options); checks the former."""
    own = {k: options[k] for k in ADAPTER_OPTIONS if k in options}
    rest = {k: v for k, v in options.items() if k not in ADAPTER_OPTIONS}
    locality = own.get("locality")
    if locality is not None and str(locality).upper() not in ("LOCAL", "REMOTE"):
        raise ConfigError(f"{path}.locality: expected LOCAL or REMOTE, got {locality!r}")
    if not isinstance(own.get("enable_kv_events", False), bool):
        raise ConfigError(f"{path}.enable_kv_events: expected true or false")
    if not isinstance(own.get("revision", ""), str):
        raise ConfigError(f"{path}.revision: expected a string")
    try:
        checked_priority(own.get("secondary_min_priority", 0))
    except ValueError as exc:
        raise ConfigError(f"{path}.secondary_min_priority: {exc}") from None
    return own, rest


def fit_to_region(config: TierConfig, region: PrimaryRegion) -> TierConfig:
    """``config``, with O_DIRECT off where vLLM's rows are not aligned for it (``auto`` only)."""
    return fit_to_rows(config, region.direct_io_capable)


_ADMISSION_FIELDS = {f.name for f in dataclasses.fields(AdmissionConfig)} - {"level"}


def admission_config(entry: Any, path: str) -> AdmissionConfig | None:
    """The tier's ``admission`` entry (``None`` if absent); ``ConfigError`` naming a bad key."""
    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        raise ConfigError(f'{path}.admission: expected an object such as {{"min_reuse": 2}}')
    unknown = sorted(set(entry) - _ADMISSION_FIELDS)
    if unknown:
        raise ConfigError(f"{path}.admission.{unknown[0]}: unknown key")
    try:
        return AdmissionConfig(level=path, **entry)
    except ConfigError as exc:
        raise ConfigError(f"{path}.admission.{exc}") from None
