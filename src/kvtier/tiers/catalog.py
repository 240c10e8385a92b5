"""Every tier type kvtier ships, registered once with ``register_tier``.

Everything that lists the tier types is derived from ``TIER_TYPES``: the configuration's types
(``kvtier.config.TIER_CONFIGS``, and the parser's ``type`` values), the builder
(``registry.build_tier``), the vLLM shims (``KvtierFs``, ...), the conformance suite's list and
the configuration docs' check. Adding a tier is its folder (the tier and its config class) and
one ``register_tier`` line here. A tier outside the package needs none of this: an entry with
``module_path`` is an ``ExternalTierConfig``.

Importing this imports each tier's config class only; a tier itself is imported when built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from kvtier.config.checks import TierName
from kvtier.tiers.fault import FaultTierConfig
from kvtier.tiers.fs.config import FsTierConfig
from kvtier.tiers.memory import MemoryTierConfig
from kvtier.tiers.peer.config import P2PTierConfig
from kvtier.tiers.s3.config import ObjTierConfig


@dataclass(frozen=True)
class VllmShim:
    """How vLLM sees the tier: the class name in ``kvtier.integrations.vllm`` and the
    ``Medium``, ``CacheHitSource`` and default locality (``None``: vLLM's own) it reports."""

    class_name: str
    medium: Literal["STORAGE", "CPU"]
    hit_source: Literal["DISK", "P2P"]
    locality: Literal["LOCAL", "REMOTE"] | None = None


@dataclass(frozen=True)
class TierType:
    """One registered tier type: ``type`` in a config entry, the dataclass that entry parses
    into, and ``build`` (``"module:attr"``, a ``SecondaryTier`` class or a function, called
    as ``build(config, region, identity)``)."""

    type_name: str
    config_class: type[Any]
    build: str
    vllm: VllmShim | None = None


@dataclass(frozen=True)
class ExternalTierConfig:
    """A tier outside the package: ``module_path`` + class name (``type``) + its own options."""

    type_name: ClassVar[str] = "module_path"
    module_path: str
    class_name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    name: TierName | None = None


TIER_TYPES: dict[str, TierType] = {}


def register_tier(config_class: type[Any], build: str, vllm: VllmShim | None = None) -> TierType:
    """Register a tier type under its config class's ``type_name``; each name once."""
    name = config_class.type_name
    if name in TIER_TYPES:
        raise ValueError(f"tier type {name!r} is registered twice")
    TIER_TYPES[name] = TierType(name, config_class, build, vllm)
    return TIER_TYPES[name]


register_tier(MemoryTierConfig, "kvtier.tiers.memory:MemoryTier")
register_tier(FaultTierConfig, "kvtier.tiers.registry:build_fault_tier")
register_tier(
    FsTierConfig, "kvtier.tiers.fs.tier:FilesystemTier", VllmShim("KvtierFs", "STORAGE", "DISK")
)
register_tier(
    ObjTierConfig,
    "kvtier.tiers.s3.tier:ObjectStoreTier",
    VllmShim("KvtierObj", "STORAGE", "DISK", "REMOTE"),
)
register_tier(
    P2PTierConfig, "kvtier.tiers.peer.tier:PeerTier", VllmShim("KvtierPeer", "CPU", "P2P", "REMOTE")
)
