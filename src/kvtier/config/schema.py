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
from typing import TYPE_CHECKING, Annotated, Any, Literal

from kvtier.config.addresses import Endpoint, HostName, is_loopback
from kvtier.config.checks import (
    Bounds,
    Count,
    FilePath,
    Messages,
    Port,
    PositiveBytes,
    RetentionPriority,
    Text,
    check_fields,
    physical_memory_bytes,
)
from kvtier.config.integrity import resolve_keys
from kvtier.config.parser import load_json, parse_config, read_config_file
from kvtier.control.admission import AdmissionConfig
from kvtier.control.slo_guard import SLOGuardConfig
from kvtier.core.deadlines import TierDeadlines
from kvtier.errors import ConfigError
from kvtier.policies.priority import DEFAULT_MAX_REQUEST_PRIORITY
from kvtier.tiers.base import TierConfig
from kvtier.tiers.catalog import TIER_TYPES
from kvtier.tiers.peer.config import ServeConfig

if TYPE_CHECKING:
    from kvtier.layout import KVLayout


#: Each registered tier type's config class, by its ``type``.
TIER_CONFIGS: dict[str, type[Any]] = {t.type_name: t.config_class for t in TIER_TYPES.values()}


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
    secondary_min_priority: RetentionPriority = 0
    #: The highest retention priority a request may ask for (0-100); more is cut to it and
    #: counted. The operator's own retention is not capped (``kvtier.control.retention``).
    max_request_priority: RetentionPriority = DEFAULT_MAX_REQUEST_PRIORITY
    #: The longest a request's retention lasts, in seconds (one asked for good, or for longer,
    #: ends then); ``None``: as long as asked.
    max_request_duration_s: (
        Annotated[
            float,
            Bounds(
                0,
                float("inf"),
                "a finite number > 0 (an integer below 2**63)",
                integer=False,
                open_low=True,
            ),
        ]
        | None
    ) = None

    #: How long the engine waits for a tier's promotion, store or probe (``core.deadlines``).
    deadlines: TierDeadlines = field(default_factory=TierDeadlines)
    #: Set glibc malloc's thresholds at start where glibc itself ends up in a long-lived
    #: process (``kvtier.core.malloc_settings``); ``False`` leaves malloc as it is.
    tune_malloc: bool = True

    def __post_init__(self) -> None:
        check_fields(self)  # first: the checks below read the values as their types
        if self.metrics_admin and self.metrics_port is None:
            raise ConfigError("metrics_admin: the admin endpoint is served on metrics_port; set it")
        if self.metrics_admin and not is_loopback(self.metrics_host):
            raise ConfigError("metrics_admin: only with a loopback metrics_host (127.0.0.1, ::1)")


#: The keys of ``RuntimeConfig``, as they appear at the top of a configuration.
RUNTIME_KEYS = (
    "metrics_port", "metrics_host", "metrics_admin", "slo_guard", "admission",
    "secondary_min_priority", "deadlines",
    "max_request_priority", "max_request_duration_s", "tune_malloc",
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
    #: A leading ``~`` is the home directory (``checks.LocalPath``).
    trace_path: FilePath | None = None
    #: vLLM's name for host memory's ``min_reuse`` (chunks seen fewer times are not stored).
    store_threshold: Annotated[int, Bounds(1, 255, "an integer from 1 to 255")] | None = None
    #: Every tier's and ``serve``'s integrity key file unless it names its own
    #: (``kvtier.config.integrity``); ``None``: chunks carry a checksum only.
    integrity_key_file: FilePath | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        tiers, serve = resolve_keys(self.integrity_key_file, self.secondary_tiers, self.serve)
        object.__setattr__(self, "secondary_tiers", tiers)  # frozen: resolved once, here
        object.__setattr__(self, "serve", serve)
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
        if not isinstance(data, Mapping):
            raise ConfigError(f"configuration: expected a JSON object, got {type(data).__name__}")
        return parse_config(cls, data)

    @classmethod
    def from_json(cls, text: str) -> TieringConfig:
        """Parse JSON text; anything that is not a valid configuration raises ``ConfigError``."""
        return cls.from_dict(load_json(text))

    @classmethod
    def load(cls, path: str | Path) -> TieringConfig:
        """Read and parse a configuration file: a regular file of at most 16 MiB of UTF-8."""
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
