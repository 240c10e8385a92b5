"""TieringConfig and one frozen dataclass per tier type, parsed and validated once at the edge.

The JSON shape of vLLM's ``--kv-transfer-config`` is accepted as is: either the whole object
(``{"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config":
{...}}``) or just its ``kv_connector_extra_config``. Any unknown key, wrong type or impossible value
raises ``ConfigError`` naming the key (as a path such as ``secondary_tiers[0].root_dir``).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Union

from kvtier.errors import ConfigError

#: Keys of vLLM's KVTransferConfig that may surround ``kv_connector_extra_config``.
VLLM_OUTER_KEYS = frozenset(
    {
        "kv_connector", "kv_role", "kv_connector_extra_config", "engine_id", "kv_buffer_device",
        "kv_buffer_size", "kv_rank", "kv_parallel_size", "kv_ip", "kv_port",
        "kv_connector_module_path", "enable_permute_local_kv", "kv_load_failure_policy",
    }
)  # fmt: skip
GiB = 1 << 30


@dataclass(frozen=True)
class MemoryTierConfig:
    """``type: "memory"``: chunks copied into process memory, bounded by ``capacity_bytes``."""

    type_name: ClassVar[str] = "memory"
    capacity_bytes: int = GiB
    n_threads: int = 2
    name: str | None = None


@dataclass(frozen=True)
class FsTierConfig:
    """``type: "fs"``: content-addressed files under ``root_dir`` (local disk or shared mount)."""

    type_name: ClassVar[str] = "fs"
    root_dir: str
    n_read_threads: int = 16
    n_write_threads: int = 16
    max_bytes: int | None = None
    min_free_bytes: int = 256 << 20
    o_direct: Literal["auto", "on", "off"] = "auto"
    fsync: bool = False
    negative_ttl_s: float = 1.0
    name: str | None = None


@dataclass(frozen=True)
class ObjTierConfig:
    """``type: "obj"``: objects in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW)."""

    type_name: ClassVar[str] = "obj"
    bucket: str
    endpoint_override: str | None = None
    prefix: str = "kvtier"
    region: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    io_threads: int = 16
    timeout_s: float = 5.0
    negative_ttl_s: float = 1.0
    circuit_failures: int = 3
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0
    name: str | None = None


@dataclass(frozen=True)
class PeerAddress:
    host: str
    port: int


@dataclass(frozen=True)
class P2PTierConfig:
    """``type: "p2p"``: fetch chunks from the host memory of peer instances.

    Peers are ``host`` + ``port`` and/or ``peers``. With CURVE, give both this client's secret
    key file and the server's public key file (as written by ``kvtier peer keygen``).
    """

    type_name: ClassVar[str] = "p2p"
    host: str | None = None
    port: int | None = None
    peers: tuple[PeerAddress, ...] = ()
    timeout_s: float = 1.0
    hit_ttl_s: float = 2.0
    curve_secret_key_file: str | None = None
    curve_server_key_file: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if (self.host is None) != (self.port is None):
            raise ConfigError("host, port: give both (or list the peers under peers)")
        if self.host is None and not self.peers:
            raise ConfigError("peers: name at least one peer (host + port, or peers)")
        _check_pair("curve_secret_key_file", "curve_server_key_file", self)

    @property
    def addresses(self) -> tuple[PeerAddress, ...]:
        if self.host is None or self.port is None:
            return self.peers
        first = PeerAddress(self.host, self.port)
        return (first, *(p for p in self.peers if p != first))


@dataclass(frozen=True)
class ServeConfig:
    """``serve``: answer lookups and fetches of peer instances out of this instance's host tier.

    Binds ``host`` (loopback unless told otherwise). With ``curve_secret_key_file`` and
    ``curve_client_keys_dir`` (every ``*.public`` file in it is an allowed client), connections
    are encrypted and clients outside the allow-list are refused. ``accept_stores`` lets peers
    write chunks into this host tier; ``hold_timeout_s`` bounds how long a slow client pins a slot.
    """

    port: int
    host: str = "127.0.0.1"
    curve_secret_key_file: str | None = None
    curve_client_keys_dir: str | None = None
    accept_stores: bool = False
    hold_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        _check_pair("curve_secret_key_file", "curve_client_keys_dir", self)


def _check_pair(first: str, second: str, config: object) -> None:
    if (getattr(config, first) is None) != (getattr(config, second) is None):
        raise ConfigError(f"{first}, {second}: CURVE needs both (or neither)")


@dataclass(frozen=True)
class FaultTierConfig:
    """``type: "fault"``: wraps ``inner`` and injects failures (for tests and drills)."""

    type_name: ClassVar[str] = "fault"
    inner: TierConfig
    fail_store: bool = False
    fail_load: bool = False
    fail_keys: tuple[str, ...] = ()
    delay_s: float = 0.0
    raise_in_submit: bool = False
    raise_in_lookup: bool = False
    name: str | None = None


@dataclass(frozen=True)
class ExternalTierConfig:
    """A tier outside the package: ``module_path`` + class name (``type``) + its own options."""

    module_path: str
    class_name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    name: str | None = None


TierConfig = Union[  # noqa: UP007 - a runtime alias used in isinstance-free annotations
    MemoryTierConfig, FsTierConfig, ObjTierConfig, P2PTierConfig, FaultTierConfig,
    ExternalTierConfig,
]  # fmt: skip
TIER_CONFIGS: dict[str, type[Any]] = {
    c.type_name: c
    for c in (MemoryTierConfig, FsTierConfig, ObjTierConfig, P2PTierConfig, FaultTierConfig)
}


@dataclass(frozen=True)
class KVEventsConfig:
    """Where KV events are published (the keys of vLLM's ``--kv-events-config`` that apply)."""

    endpoint: str = "tcp://*:5557"
    topic: str | None = None
    publisher: Literal["zmq"] = "zmq"
    hwm: int = 100_000
    enable_kv_cache_events: bool = True


@dataclass(frozen=True)
class TieringConfig:
    """The whole kvtier configuration (vLLM's ``kv_connector_extra_config`` plus its wrapper)."""

    cpu_bytes_to_use: int
    block_size: int | None = None
    blocks_per_chunk: int | None = None
    eviction_policy: Literal["lru", "arc"] = "lru"
    secondary_tiers: tuple[TierConfig, ...] = ()
    spec_name: str = "TieringOffloadingSpec"
    spec_module_path: str | None = None
    kv_connector: str | None = None
    kv_role: str | None = None
    serve: ServeConfig | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    kv_events: KVEventsConfig | None = None

    def __post_init__(self) -> None:
        _check_positive("cpu_bytes_to_use", self.cpu_bytes_to_use)
        if self.block_size is not None and self.blocks_per_chunk is not None:
            raise ConfigError(
                "block_size, blocks_per_chunk: give one or the other, not both "
                "(block_size is tokens per chunk; blocks_per_chunk counts engine blocks)"
            )
        for key in ("block_size", "blocks_per_chunk"):
            if getattr(self, key) is not None:
                _check_positive(key, getattr(self, key))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TieringConfig:
        if not isinstance(data, Mapping):
            raise ConfigError(f"configuration: expected a JSON object, got {type(data).__name__}")
        return _parse_top(data)

    @classmethod
    def from_json(cls, text: str) -> TieringConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"configuration: not valid JSON ({exc})") from exc
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> TieringConfig:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"configuration file {path}: {exc.strerror or exc}") from exc
        return cls.from_json(text)

    def blocks_per_chunk_for(self, engine_block_size: int) -> int | None:
        """Engine blocks per chunk this config asks for, or ``None`` when it leaves it open."""
        if self.blocks_per_chunk is not None:
            return self.blocks_per_chunk
        if self.block_size is None:
            return None
        if self.block_size % engine_block_size:
            raise ConfigError(
                f"block_size: expected a multiple of the engine block size {engine_block_size}, "
                f"got {self.block_size}"
            )
        return self.block_size // engine_block_size


def _check_positive(key: str, value: int) -> None:
    if value <= 0:
        raise ConfigError(f"{key}: expected a positive integer, got {value}")


def _parse_top(data: Mapping[str, Any]) -> TieringConfig:
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
