"""Parsing configuration JSON into the frozen dataclasses of ``kvtier.config``.

Every key is checked against the dataclass field's type hint (integers, numbers, strings,
booleans, literals, optionals, lists, nested dataclasses, and the tier union); anything unknown,
mistyped or impossible raises ``ConfigError`` naming the key as a path such as
``secondary_tiers[0].root_dir``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

from kvtier.config import (
    TIER_CONFIGS,
    ExternalTierConfig,
    TierConfig,
    TieringConfig,
)
from kvtier.errors import ConfigError

#: Keys of vLLM's KVTransferConfig that may surround ``kv_connector_extra_config``.
VLLM_OUTER_KEYS = frozenset(
    {
        "kv_connector", "kv_role", "kv_connector_extra_config", "engine_id", "kv_buffer_device",
        "kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip", "kv_port",
        "kv_connector_module_path", "enable_permute_local_kv", "kv_load_failure_policy",
    }
)  # fmt: skip


def parse_config(data: Mapping[str, Any]) -> TieringConfig:
    """The whole vLLM kv-transfer-config, or just its ``kv_connector_extra_config``."""
    outer: dict[str, Any] = {}
    if "kv_connector_extra_config" in data or "kv_connector" in data:
        unknown = sorted(set(data) - VLLM_OUTER_KEYS)
        if unknown:
            raise ConfigError(f"{unknown[0]}: unknown key of the vLLM kv-transfer-config")
        outer = {k: data[k] for k in ("kv_connector", "kv_role") if k in data}
        data = data.get("kv_connector_extra_config", {})
        if not isinstance(data, Mapping):
            raise ConfigError("kv_connector_extra_config: expected a JSON object")
    if "cpu_bytes_to_use" not in data:
        raise ConfigError("cpu_bytes_to_use: required (bytes of host memory for the host tier)")
    config: TieringConfig = parse_dataclass(TieringConfig, {**data, **outer}, "")
    return config


def parse_tier(data: Any, path: str) -> TierConfig:
    """Parse one entry of ``secondary_tiers``."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a JSON object describing a tier")
    if "module_path" in data:
        return _parse_external(data, path)
    kind = data.get("type")
    if kind not in TIER_CONFIGS:
        known = ", ".join(sorted(TIER_CONFIGS))
        raise ConfigError(f"{path}.type: expected one of {known} (or a module_path), got {kind!r}")
    fields = {k: v for k, v in data.items() if k != "type"}
    if kind == "obj" and "store_config" in fields:
        fields = _flatten_store_config(fields, path)
    parsed: TierConfig = parse_dataclass(TIER_CONFIGS[kind], fields, path)
    return parsed


def _flatten_store_config(fields: Mapping[str, Any], path: str) -> dict[str, Any]:
    nested = fields["store_config"]
    if not isinstance(nested, Mapping):
        raise ConfigError(f"{path}.store_config: expected a JSON object")
    clash = sorted(set(nested) & set(fields))
    if clash:
        raise ConfigError(f"{path}.store_config.{clash[0]}: also given outside store_config")
    return {**{k: v for k, v in fields.items() if k != "store_config"}, **nested}


def _parse_external(data: Mapping[str, Any], path: str) -> ExternalTierConfig:
    module_path, class_name = data["module_path"], data.get("type")
    if not isinstance(module_path, str) or not module_path:
        raise ConfigError(f"{path}.module_path: expected a dotted module name")
    if not isinstance(class_name, str) or not class_name:
        raise ConfigError(f"{path}.type: expected the tier's class name in module {module_path}")
    name = data.get("name")
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"{path}.name: expected a string")
    options = {k: v for k, v in data.items() if k not in ("module_path", "type", "name")}
    return ExternalTierConfig(module_path, class_name, options, name)


def parse_dataclass(cls: type[Any], data: Mapping[str, Any], path: str) -> Any:
    """Build dataclass ``cls`` from ``data``, checking every key and value against the hints."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    prefix = f"{path}." if path else ""
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}: unknown key (expected one of {sorted(fields)})")
    values = {k: coerce(v, hints[k], f"{prefix}{k}") for k, v in data.items()}
    missing = [n for n, f in fields.items() if n not in values and _required(f)]
    if missing:
        raise ConfigError(f"{prefix}{missing[0]}: required")
    try:
        return cls(**values)
    except ConfigError as exc:
        raise ConfigError(f"{prefix}{exc}" if prefix else str(exc)) from None


def _required(f: dataclasses.Field[Any]) -> bool:
    no_default = f.default is dataclasses.MISSING
    return no_default and f.default_factory is dataclasses.MISSING


def coerce(value: Any, hint: Any, path: str) -> Any:
    """Check ``value`` against type ``hint``; returns it converted (lists become tuples)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is TierConfig or (origin in (Union, types.UnionType) and ExternalTierConfig in args):
        return parse_tier(value, path)
    if origin in (Union, types.UnionType):
        return _coerce_optional(value, args, path)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}: expected one of {list(args)}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected a list, got {_kind(value)}")
        return tuple(coerce(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a JSON object, got {_kind(value)}")
        return parse_dataclass(hint, value, path)  # type: ignore[arg-type]
    return _coerce_scalar(value, hint, path)


def _coerce_optional(value: Any, args: tuple[Any, ...], path: str) -> Any:
    if value is None and type(None) in args:
        return None
    (inner,) = [a for a in args if a is not type(None)]
    return coerce(value, inner, path)


def _coerce_scalar(value: Any, hint: Any, path: str) -> Any:
    if hint is Any or hint is Mapping[str, Any]:
        return value
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0 or (value == 0 and path.endswith("timeout_s")):
            kind = "positive" if path.endswith("timeout_s") else "non-negative"
            raise ConfigError(f"{path}: expected a {kind} number of seconds, got {value}")
        return float(value)
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        if value < 0 or (value == 0 and not path.endswith("_bytes")):
            raise ConfigError(f"{path}: expected a positive integer, got {value}")
        return value
    if hint in (str, bool) and type(value) is hint:
        if hint is str and not value:
            raise ConfigError(f"{path}: expected a non-empty string")
        return value
    raise ConfigError(f"{path}: expected {_type_word(hint)}, got {_kind(value)} {value!r}")


def _type_word(hint: Any) -> str:
    words = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    return words.get(hint, str(hint))


def _kind(value: Any) -> str:
    words = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return words.get(type(value), type(value).__name__)
