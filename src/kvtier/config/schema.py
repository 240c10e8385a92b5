"""TieringConfig and one frozen dataclass per tier type, parsed and validated once at the edge.

The JSON shape of vLLM's ``--kv-transfer-config`` is accepted as is: either the whole object
(``{"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config":
{...}}``) or just its ``kv_connector_extra_config``. Any unknown key, wrong type or impossible value
raises ``ConfigError`` naming the key (as a path such as ``secondary_tiers[0].root_dir``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

from kvtier.config.checks import (
    BindHost,
    Bounds,
    Bytes,
    Count,
    DirMode,
    Endpoint,
    HexKey,
    HostName,
    HttpUrl,
    Messages,
    Port,
    PositiveBytes,
    Seconds,
    Text,
    Threads,
    Timeout,
    check_fields,
    physical_memory_bytes,
)
from kvtier.control.admin import is_loopback
from kvtier.control.admission import AdmissionConfig
from kvtier.control.slo_guard import SLOGuardConfig
from kvtier.errors import ConfigError

if TYPE_CHECKING:
    from kvtier.layout import KVLayout

GiB = 1 << 30


@dataclass(frozen=True)
class MemoryTierConfig:
    """``type: "memory"``: chunks copied into process memory, bounded by ``capacity_bytes``."""

    type_name: ClassVar[str] = "memory"
    capacity_bytes: Bytes = GiB
    n_threads: Threads = 2
    name: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class FsTierConfig:
    """``type: "fs"``: content-addressed files under ``root_dir`` (local disk or shared mount).

    ``dir_mode`` is the mode of the directories the tier creates (``root_dir`` and its parents
    too, where missing); its files get the same bits without execute (``kvtier.config.file_modes``).
    """

    type_name: ClassVar[str] = "fs"
    root_dir: str
    n_read_threads: Threads = 16
    n_write_threads: Threads = 16
    max_bytes: Bytes | None = None
    min_free_bytes: Bytes = 256 << 20
    o_direct: Literal["auto", "on", "off"] = "auto"
    fsync: bool = False
    negative_ttl_s: Seconds = 1.0
    dir_mode: DirMode = "0700"
    name: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class ObjTierConfig:
    """``type: "obj"``: objects in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW)."""

    type_name: ClassVar[str] = "obj"
    bucket: str
    endpoint_override: Annotated[str, HttpUrl()] | None = None
    prefix: str = "kvtier"
    region: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    io_threads: Threads = 16
    timeout_s: Timeout = 5.0
    negative_ttl_s: Seconds = 1.0
    circuit_failures: Count = 3
    reconnect_min_s: Timeout = 0.5
    reconnect_max_s: Timeout = 30.0
    name: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ConfigError(
                f"reconnect_max_s: expected at least reconnect_min_s ({self.reconnect_min_s}), "
                f"got {self.reconnect_max_s}"
            )


@dataclass(frozen=True)
class PeerAddress:
    host: HostName
    port: Port

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class P2PTierConfig:
    """``type: "p2p"``: fetch chunks from the host memory of peer instances.

    Peers are ``host`` + ``port`` and/or ``peers``. With CURVE, give both this client's secret
    key file and the server's public key file (as written by ``kvtier peer keygen``).
    """

    type_name: ClassVar[str] = "p2p"
    host: HostName | None = None
    port: Port | None = None
    peers: tuple[PeerAddress, ...] = ()
    timeout_s: Timeout = 1.0
    hit_ttl_s: Seconds = 2.0
    curve_secret_key_file: str | None = None
    curve_server_key_file: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)
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
    write chunks into this host tier; it is refused beyond loopback without CURVE (any host that
    reaches the port could write the cache) unless ``allow_insecure_stores`` forces it.
    ``hold_timeout_s`` bounds how long a slow client pins a slot.
    """

    port: Port
    host: BindHost = "127.0.0.1"
    curve_secret_key_file: str | None = None
    curve_client_keys_dir: str | None = None
    accept_stores: bool = False
    hold_timeout_s: Timeout = 5.0
    allow_insecure_stores: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        _check_pair("curve_secret_key_file", "curve_client_keys_dir", self)
        insecure = self.curve_secret_key_file is None and not self.loopback
        if self.accept_stores and insecure and not self.allow_insecure_stores:
            raise ConfigError(
                f"accept_stores: refused on {self.host} without CURVE (any host that reaches the "
                "port could write this cache); configure CURVE, bind loopback, or set "
                "allow_insecure_stores"
            )

    @property
    def loopback(self) -> bool:
        """Whether ``host`` is a loopback address (only this machine can connect)."""
        import ipaddress

        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:
            return False  # a name or a wildcard: assume it is reachable from elsewhere


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
    fail_keys: tuple[Annotated[str, HexKey()], ...] = ()
    delay_s: Seconds = 0.0
    raise_in_submit: bool = False
    raise_in_lookup: bool = False
    name: str | None = None

    def __post_init__(self) -> None:
        check_fields(self)


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
    """Where KV events are published (the keys of vLLM's ``--kv-events-config`` that apply).

    The publisher binds ``endpoint``: loopback by default, unauthenticated, so anyone who can
    reach it can read every chunk key; bind another address only on a trusted network.
    """

    endpoint: Annotated[str, Endpoint()] = "tcp://127.0.0.1:5557"
    topic: Annotated[str, Text(empty=True)] | None = None
    publisher: Literal["zmq"] = "zmq"
    hwm: Messages = 100_000
    enable_kv_cache_events: bool = True

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class RuntimeConfig:
    """The settings of a kvtier runtime (``kvtier.core.runtime``): what it decides and serves.

    The same keys, with the same checks, at the top of a ``TieringConfig`` and of vLLM's
    ``kv_connector_extra_config`` (``kvtier.integrations.vllm.engine_config``).
    """

    metrics_port: Port | None = None
    metrics_host: HostName = "127.0.0.1"
    #: Serve ``/admin/...`` (switch tiers) beside ``/metrics``: loopback metrics_host only.
    metrics_admin: bool = False
    #: Switch a tier off while it breaks a latency budget (``kvtier.control.slo_guard``); off
    #: when ``None``.
    slo_guard: SLOGuardConfig | None = None
    #: What each level keeps (``kvtier.control.admission``): ``level`` is ``host`` or a tier's name.
    admission: tuple[AdmissionConfig, ...] = ()
    #: Chunks retained below this priority (0-100) are never written to secondary tiers.
    secondary_min_priority: Annotated[int, Bounds(0, 100, "an integer from 0 to 100")] = 0

    def __post_init__(self) -> None:
        _check_range("secondary_min_priority", self.secondary_min_priority, 0, 100)
        if self.metrics_admin and self.metrics_port is None:
            raise ConfigError("metrics_admin: the admin endpoint is served on metrics_port; set it")
        if self.metrics_admin and not is_loopback(self.metrics_host):
            raise ConfigError("metrics_admin: only with a loopback metrics_host (127.0.0.1, ::1)")
        check_fields(self)


#: The keys of ``RuntimeConfig``, as they appear at the top of a configuration.
RUNTIME_KEYS = (
    "metrics_port", "metrics_host", "metrics_admin", "slo_guard", "admission",
    "secondary_min_priority",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class TieringConfig(RuntimeConfig):
    """The whole kvtier configuration (vLLM's ``kv_connector_extra_config`` plus its wrapper):
    the runtime's keys (``RuntimeConfig``), the host tier and the secondary tiers."""

    cpu_bytes_to_use: PositiveBytes
    block_size: Count | None = None
    blocks_per_chunk: Count | None = None
    eviction_policy: Literal["lru", "arc"] = "lru"
    secondary_tiers: tuple[TierConfig, ...] = ()
    spec_name: str = "TieringOffloadingSpec"
    spec_module_path: str | None = None
    kv_connector: str | None = None
    kv_role: str | None = None
    serve: ServeConfig | None = None
    kv_events: KVEventsConfig | None = None
    #: Record a request trace (``kvtier.plan.trace``) here, for ``kvtier plan``; off when ``None``.
    trace_path: str | None = None
    #: vLLM's name for host memory's ``min_reuse`` (chunks seen fewer times are not stored).
    store_threshold: Annotated[int, Bounds(1, 255, "an integer from 1 to 255")] | None = None

    def __post_init__(self) -> None:
        _check_range("store_threshold", self.store_threshold, 1, 255)
        super().__post_init__()
        if self.block_size is not None and self.blocks_per_chunk is not None:
            raise ConfigError(
                "block_size, blocks_per_chunk: give one or the other, not both "
                "(block_size is tokens per chunk; blocks_per_chunk counts engine blocks)"
            )

    def runtime_config(self) -> RuntimeConfig:
        """The runtime's settings, with ``store_threshold`` as host memory's ``min_reuse``."""
        fields = {key: getattr(self, key) for key in RUNTIME_KEYS}
        return RuntimeConfig(**{**fields, "admission": self.admission_configs()})

    def admission_configs(self) -> tuple[AdmissionConfig, ...]:
        """``admission``, plus ``store_threshold`` as host memory's ``min_reuse``."""
        if self.store_threshold is None:
            return self.admission
        return (*self.admission, AdmissionConfig(level="host", min_reuse=self.store_threshold))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TieringConfig:
        from kvtier.config.parser import parse_config

        if not isinstance(data, Mapping):
            raise ConfigError(f"configuration: expected a JSON object, got {type(data).__name__}")
        return parse_config(data)

    @classmethod
    def from_json(cls, text: str) -> TieringConfig:
        """Parse JSON text; anything that is not a valid configuration raises ``ConfigError``."""
        from kvtier.config.parser import load_json

        return cls.from_dict(load_json(text))

    @classmethod
    def load(cls, path: str | Path) -> TieringConfig:
        """Read and parse a configuration file: a regular file of at most 16 MiB of UTF-8."""
        from kvtier.config.parser import read_config_file

        return cls.from_json(read_config_file(path))

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

    def host_slots(self, chunk_bytes: int, check_memory: bool = True) -> int:
        """How many host slots ``cpu_bytes_to_use`` holds (each rounded up to 4 KiB).

        ``ConfigError`` if not even one, or (``check_memory``) if the slots would take more
        than this host's physical memory.
        """
        stride = -(-chunk_bytes // 4096) * 4096
        num_slots = self.cpu_bytes_to_use // stride
        if num_slots == 0:
            raise ConfigError(
                f"cpu_bytes_to_use: {self.cpu_bytes_to_use} bytes cannot hold one chunk "
                f"of {chunk_bytes} bytes"
            )
        physical = physical_memory_bytes() if check_memory else None
        if physical is not None and num_slots * stride > physical:
            raise ConfigError(
                f"cpu_bytes_to_use: {num_slots * stride} bytes of host slots exceed this "
                f"host's physical memory ({physical} bytes)"
            )
        return num_slots

    def exceeds_memory(self) -> int | None:
        """This host's physical memory if ``cpu_bytes_to_use`` exceeds it, else ``None``."""
        physical = physical_memory_bytes()
        return physical if physical is not None and self.cpu_bytes_to_use > physical else None

    def check_layout(self, layout: KVLayout) -> None:
        """The chunk size this config asks for, if any, must be ``layout``'s."""
        wanted = self.blocks_per_chunk_for(layout.block_size)
        if wanted is not None and wanted != layout.blocks_per_chunk:
            key = "blocks_per_chunk" if self.blocks_per_chunk is not None else "block_size"
            raise ConfigError(
                f"{key}: the configuration asks for {wanted} engine blocks per chunk but the "
                f"layout has {layout.blocks_per_chunk} ({layout.tokens_per_chunk} tokens per chunk)"
            )


def _check_range(key: str, value: object, low: int, high: int) -> None:
    """``ConfigError`` unless ``value`` is ``None`` or an integer from ``low`` to ``high``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{key}: expected an integer from {low} to {high}, got {value!r}")
