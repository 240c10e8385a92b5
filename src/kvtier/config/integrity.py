"""The configuration's integrity keys: the top-level ``integrity_key_file`` as every tier's
default, and the checks that span tiers (``kvtier.tiers.shared.sealing`` seals the chunks).

A tier entry or ``serve`` that names no ``integrity_key_file`` of its own takes the top-level
one; a ``fault`` entry passes it on to the tier it wraps. Tiers outside the package
(``module_path``) are left alone. With a key anywhere, a peer server that accepts stores must
check them (CURVE or a key of its own, ``ServeConfig.check_stores_authenticated``): what a peer
stores is written through to the sealing tiers, sealed. The key files themselves are read when
the tiers start (a refused one raises ``ConfigError`` then).

Thread safety: plain functions over frozen dataclasses; any thread.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvtier.config.checks import key_path
from kvtier.errors import ConfigError
from kvtier.tiers.base import TierConfig
from kvtier.tiers.peer.config import ServeConfig

KEY_FIELD = "integrity_key_file"


def with_default_key(config: Any, key_file: str | None) -> Any:
    """``config`` with ``key_file`` where it has the field and names no key of its own (the
    wrapped entry of a ``fault`` entry too); otherwise ``config`` itself."""
    if key_file is None or not dataclasses.is_dataclass(config) or isinstance(config, type):
        return config
    inner = getattr(config, "inner", None)
    if inner is not None:
        config = dataclasses.replace(config, inner=with_default_key(inner, key_file))
    if KEY_FIELD not in {f.name for f in dataclasses.fields(config)}:
        return config
    if getattr(config, KEY_FIELD) is not None:
        return config
    return dataclasses.replace(config, **{KEY_FIELD: key_file})


def resolve_keys(
    key_file: str | None, tiers: tuple[TierConfig, ...], serve: ServeConfig | None
) -> tuple[tuple[TierConfig, ...], ServeConfig | None]:
    """The tiers and ``serve`` with the top-level ``key_file`` as their default, checked:
    ``encrypt`` needs a key, and with keys on, ``serve`` may accept only checked stores."""
    tiers = tuple(with_default_key(tier, key_file) for tier in tiers)
    serve = with_default_key(serve, key_file) if serve is not None else None
    for index, tier in enumerate(tiers):
        if getattr(tier, "encrypt", False) and getattr(tier, KEY_FIELD, None) is None:
            raise ConfigError(
                f"secondary_tiers[{index}].encrypt: needs integrity_key_file (on the tier, or "
                "at the top level): the key encrypts the chunks"
            )
    if serve is not None and any(_keyed(tier) for tier in tiers):
        with key_path("serve"):
            serve.check_stores_authenticated()
    return tiers, serve


def _keyed(config: Any) -> bool:
    inner = getattr(config, "inner", None)
    return getattr(config, KEY_FIELD, None) is not None or (inner is not None and _keyed(inner))
