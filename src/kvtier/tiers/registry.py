"""Builds secondary tiers from their configuration: registered types (``catalog``), or
``module_path`` + class.

Registered types are imported lazily so that a tier's heavy dependencies (an S3 client, ZeroMQ)
are only needed when that tier is configured.

Every tier, built-in or not, is built the same way: ``cls(config, region, identity)``. For a
tier outside the package (``module_path`` + ``type``), ``config`` is its entry's other options:
validated into the dataclass it names as ``config_class`` (with the same errors as built-in
tiers), or else a read-only mapping. A class whose constructor cannot take those three
arguments is refused with a ``ConfigError`` at start.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from kvtier.config.checks import MAX_LABEL_CHARS
from kvtier.config.parser import parse_dataclass
from kvtier.errors import ConfigError
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import SecondaryTier, TierConfig
from kvtier.tiers.catalog import TIER_TYPES, ExternalTierConfig
from kvtier.tiers.fault import FaultInjectingTier, FaultTierConfig


def build_tier(config: TierConfig, region: HostRegion, identity: CacheIdentity) -> SecondaryTier:
    """A started tier for ``config``; raises ``ConfigError`` or ``TierError`` if it cannot be."""
    if isinstance(config, ExternalTierConfig):
        cls = load_tier_class(config.module_path, config.class_name)
        options: Any = MappingProxyType(dict(config.options))
        config_class = getattr(cls, "config_class", None)
        if config_class is not None:
            options = parse_dataclass(config_class, options, config.class_name)
        tier = construct(cls, options, region, identity)
    else:
        module_path, attr = TIER_TYPES[config.type_name].build.split(":")
        tier = getattr(importlib.import_module(module_path), attr)(config, region, identity)
    if config.name:
        tier.name = config.name
    return tier


def construct(
    cls: Callable[..., SecondaryTier], options: Any, region: HostRegion, identity: CacheIdentity
) -> SecondaryTier:
    """``cls(options, region, identity)``; ``ConfigError`` if its constructor cannot take them."""
    try:
        inspect.signature(cls).bind(options, region, identity)
    except TypeError as exc:
        name = getattr(cls, "__name__", cls)
        raise ConfigError(
            f"type: {name} must be built as {name}(config, region, identity) ({exc})"
        ) from None
    return cls(options, region, identity)


def load_tier_class(module_path: str, class_name: str) -> Callable[..., SecondaryTier]:
    """Import ``module_path`` and return its ``class_name``, which must be a SecondaryTier;
    ``ConfigError`` otherwise, a module that fails as it is imported included."""
    try:  # a relative name raises TypeError, a broken module anything at all
        module = importlib.import_module(module_path)
    except Exception as exc:
        raise ConfigError(f"module_path: cannot import {module_path!r} ({exc})") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ConfigError(f"type: module {module_path!r} has no class {class_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, SecondaryTier)):
        raise ConfigError(
            f"type: {module_path}.{class_name} is not a tier "
            "(expected a subclass of kvtier.tiers.base.SecondaryTier)"
        )
    return cls


def make_names_unique(tiers: list[SecondaryTier]) -> None:
    """Suffix ``#<index>`` to the name of every tier whose name another tier shares, cutting
    the name where the whole would pass ``MAX_LABEL_CHARS``."""
    seen: dict[str, int] = {}
    for tier in tiers:
        seen[tier.name] = seen.get(tier.name, 0) + 1
    for index, tier in enumerate(tiers):
        if seen[tier.name] > 1:
            suffix = f"#{index}"
            tier.name = tier.name[: MAX_LABEL_CHARS - len(suffix)] + suffix


def build_fault_tier(
    config: FaultTierConfig, region: HostRegion, identity: CacheIdentity
) -> FaultInjectingTier:
    """The tier of a ``type: "fault"`` entry: ``config.inner`` built, then wrapped."""
    try:
        keys = [ChunkKey(bytes.fromhex(k)) for k in config.fail_keys]
    except ValueError as exc:
        raise ConfigError(f"fail_keys: expected hex chunk keys ({exc})") from exc
    return FaultInjectingTier(
        build_tier(config.inner, region, identity),
        fail_store=config.fail_store,
        fail_load=config.fail_load,
        fail_keys=keys,
        delay_s=config.delay_s,
        raise_in_submit=config.raise_in_submit,
        raise_in_lookup=config.raise_in_lookup,
        name=config.name,
    )
