"""Parsing configuration JSON into the frozen dataclasses of ``kvtier.config.schema``.

Every key is checked against the dataclass field's type hint (integers, numbers, strings,
booleans, literals, optionals, lists, nested dataclasses, and the tier union) and the checks
its ``Annotated`` marks carry (``kvtier.config.checks``: ranges, ports, hosts, endpoints);
anything unknown, mistyped or impossible raises ``ConfigError`` naming the key as a path such as
``secondary_tiers[0].root_dir``. The value of a credential (a field with ``repr=False``) is never
repeated in a message.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import stat
import types
import typing
from collections import Counter
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union

from kvtier.config.checks import (
    Check,
    Label,
    PythonName,
    default_marks,
    error_reason,
    marks_of,
)
from kvtier.errors import ConfigError, shown
from kvtier.tiers.base import TierConfig
from kvtier.tiers.catalog import TIER_TYPES, ExternalTierConfig

T = TypeVar("T")

#: The largest configuration file read, and the deepest nesting of JSON values accepted.
MAX_FILE_BYTES = 16 << 20
MAX_DEPTH = 64

#: Keys of vLLM's KVTransferConfig that may surround ``kv_connector_extra_config``.
VLLM_OUTER_KEYS = frozenset(
    {
        "kv_connector", "kv_role", "kv_connector_extra_config", "engine_id", "kv_buffer_device",
        "kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip", "kv_port",
        "kv_connector_module_path", "enable_permute_local_kv", "kv_load_failure_policy",
    }
)  # fmt: skip


def read_config_file(path: str | Path) -> str:
    """The text of a configuration file; ``ConfigError`` unless it is a regular file (never
    blocks on a FIFO) of at most ``MAX_FILE_BYTES`` bytes of UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError, TypeError) as exc:  # a NUL in the path; not a path at all
        raise ConfigError(f"configuration file {path}: {error_reason(exc)}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"configuration file {path}: not a regular file")
    with open(fd, "rb") as file:
        data = _read(file, path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"configuration file {path}: not UTF-8 text") from None


def _read(file: Any, path: str | Path) -> bytes:
    try:
        data: bytes = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"configuration file {path}: {error_reason(exc)}") from exc
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"configuration file {path}: larger than {MAX_FILE_BYTES >> 20} MiB")
    return data


def load_json(text: str | bytes) -> Any:
    """``json.loads``, with every failure a ``ConfigError``: not text (``str``, or UTF-8
    ``bytes``), bad syntax, too deep a nesting, a huge number, or a key given twice in one
    object (``json`` would keep the last silently, where a reader may believe the first)."""
    if not isinstance(text, str | bytes | bytearray):
        kind = type(text).__name__
        raise ConfigError(f"configuration: expected JSON text (str or bytes), got {kind}")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"configuration: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        raise ConfigError(f"configuration: not valid JSON ({exc})") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; ``ConfigError`` naming a key that comes twice."""
    data = dict(pairs)
    if len(data) < len(pairs):
        twice = next(key for key, n in Counter(key for key, _ in pairs).items() if n > 1)
        raise ConfigError(f"{twice}: given twice in one JSON object (give each key once)")
    return data


def check_depth(data: Any, limit: int = MAX_DEPTH) -> None:
    """``ConfigError`` if objects and lists nest deeper than ``limit`` (checked iteratively)."""
    level: list[Any] = [data]
    for _ in range(limit + 1):
        level = [v for item in level for v in _children(item)]
        if not level:
            return
    raise ConfigError(f"configuration: nested deeper than {limit} levels")


def _children(item: Any) -> list[Any]:
    if isinstance(item, Mapping):
        return list(item.values())
    return list(item) if isinstance(item, list | tuple) else []


def parse_config(cls: type[T], data: Mapping[str, Any]) -> T:
    """``cls`` (``TieringConfig``) from the whole vLLM kv-transfer-config, or just its
    ``kv_connector_extra_config``."""
    check_depth(data)
    outer: dict[str, Any] = {}
    if "kv_connector_extra_config" in data or "kv_connector" in data:
        unknown = first_unknown(data, VLLM_OUTER_KEYS)
        if unknown is not None:
            hint = did_you_mean(unknown, VLLM_OUTER_KEYS)
            raise ConfigError(f"{unknown}: unknown key of the vLLM kv-transfer-config{hint}")
        outer = {k: data[k] for k in ("kv_connector", "kv_role") if k in data}
        data = data.get("kv_connector_extra_config", {})
        if not isinstance(data, Mapping):
            raise ConfigError("kv_connector_extra_config: expected a JSON object")
    if "cpu_bytes_to_use" not in data:
        raise ConfigError("cpu_bytes_to_use: required (bytes of host memory for the host tier)")
    config: T = parse_dataclass(cls, {**data, **outer}, "")
    return config


def parse_tier(data: Any, path: str) -> TierConfig:
    """Parse one entry of ``secondary_tiers``."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a JSON object describing a tier")
    if "module_path" in data:
        return _parse_external(data, path)
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in TIER_TYPES:  # a list or object is unhashable
        known = ", ".join(sorted(TIER_TYPES))
        raise ConfigError(f"{path}.type: expected one of {known} (or a module_path), got {kind!r}")
    fields = {k: v for k, v in data.items() if k != "type"}
    if kind == "obj" and "store_config" in fields:
        fields = _flatten_store_config(fields, path)
    parsed: TierConfig = parse_dataclass(TIER_TYPES[kind].config_class, fields, path)
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
    """An entry with ``module_path``: its module is a dotted Python name, its class (``type``)
    an identifier, and its ``name`` a ``Label`` (as the built-in tiers' ``name``); the module
    is imported, and the class looked up, when the tier starts (``kvtier.tiers.registry``)."""
    module_path, class_name = data["module_path"], data.get("type")
    if not isinstance(module_path, str) or not module_path:
        raise ConfigError(f"{path}.module_path: expected a dotted module name")
    PythonName(dotted=True).check(module_path, f"{path}.module_path")
    if not isinstance(class_name, str) or not class_name:
        raise ConfigError(f"{path}.type: expected the tier's class name in module {module_path}")
    PythonName().check(class_name, f"{path}.type")
    name = data.get("name")
    if name is not None:
        Label().check(name, f"{path}.name")
    options = {k: v for k, v in data.items() if k not in ("module_path", "type", "name")}
    return ExternalTierConfig(module_path, class_name, options, name)


def parse_dataclass(cls: type[Any], data: Mapping[str, Any], path: str) -> Any:
    """Build dataclass ``cls`` from ``data``, checking every key and value against the hints."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    prefix = f"{path}." if path else ""
    unknown = first_unknown(data, fields)
    if unknown is not None:
        hint = f"{did_you_mean(unknown, fields)} (expected one of {sorted(fields)})"
        raise ConfigError(f"{prefix}{unknown}: unknown key{hint}")
    values = {k: _coerce_field(v, hints[k], f"{prefix}{k}", fields[k]) for k, v in data.items()}
    missing = [n for n, f in fields.items() if n not in values and _required(f)]
    if missing:
        raise ConfigError(f"{prefix}{missing[0]}: required")
    try:
        return cls(**values)
    except ConfigError as exc:
        raise ConfigError(f"{prefix}{exc}" if prefix else str(exc)) from None


def first_unknown(data: Mapping[Any, Any], known: Collection[str]) -> str | None:
    """The first key of ``data`` (in the order of their text) that ``known`` lacks, as text;
    ``None`` if none. Keys of a dict built in Python may be of any type (``None``, ``1``)."""
    unknown = sorted(str(key) for key in data if key not in known)
    return unknown[0] if unknown else None


def did_you_mean(key: str, known: Collection[str]) -> str:
    """``", did you mean KNOWN?"`` for the known key closest to a typo'd ``key``, else ``""``."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.7)
    return f", did you mean {close[0]}?" if close else ""


def _coerce_field(value: Any, hint: Any, path: str, f: dataclasses.Field[Any]) -> Any:
    """``coerce``; for a credential (``repr=False``) the message does not repeat the value."""
    try:
        return coerce(value, hint, path)
    except ConfigError:
        if f.repr:
            raise
        raise ConfigError(f"{path}: expected a non-empty string (value not shown)") from None


def _required(f: dataclasses.Field[Any]) -> bool:
    no_default = f.default is dataclasses.MISSING
    return no_default and f.default_factory is dataclasses.MISSING


def coerce(value: Any, hint: Any, path: str) -> Any:
    """Check ``value`` against type ``hint``; returns it converted (lists become tuples)."""
    marks: tuple[Check, ...] = ()
    if typing.get_origin(hint) is Annotated:
        hint, marks = hint.__origin__, marks_of(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is TierConfig or (origin in (Union, types.UnionType) and ExternalTierConfig in args):
        return parse_tier(value, path)
    if origin in (Union, types.UnionType):
        return _coerce_optional(value, args, path)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}: expected one of {list(args)}, got {shown(value, None)}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected a list, got {_kind(value)}")
        return tuple(coerce(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a JSON object, got {_kind(value)}")
        return parse_dataclass(hint, value, path)  # type: ignore[arg-type]
    return _coerce_scalar(value, hint, path, marks)


def _coerce_optional(value: Any, args: tuple[Any, ...], path: str) -> Any:
    if value is None and type(None) in args:
        return None
    (inner,) = [a for a in args if a is not type(None)]
    return coerce(value, inner, path)


def _coerce_scalar(value: Any, hint: Any, path: str, marks: tuple[Check, ...]) -> Any:
    """A number, string or boolean of type ``hint``, checked by ``marks`` (or the defaults)."""
    if hint is Any or hint is Mapping[str, Any]:
        return value
    number = isinstance(value, int | float) and not isinstance(value, bool)
    fits = (hint is float and number) or (hint is int and isinstance(value, int) and number)
    if not fits and not (hint in (str, bool) and type(value) is hint):
        got = f"{_kind(value)} {shown(value, None)}"
        raise ConfigError(f"{path}: expected {_type_word(hint)}, got {got}")
    for mark in marks or default_marks(hint, path.rpartition(".")[2]):
        mark.check(value, path)
    return float(value) if hint is float else value


def _type_word(hint: Any) -> str:
    words = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    return words.get(hint, str(hint))


def _kind(value: Any) -> str:
    words = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return words.get(type(value), type(value).__name__)
