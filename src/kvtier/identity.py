"""CacheIdentity: what makes the bytes of two caches interchangeable.

Two instances may share chunks only if every input that decides the KV bytes is the same: the
model weights, the KV dtype and layout, and anything else that changes KV (RoPE scaling,
quantization). The identity's digest seeds the key chain and names the namespace of every tier.

A local model is named by its content, not its path (``kvtier.model_fingerprint``): with
``fingerprint`` set, ``model`` is only a display name and the digest does not depend on it, so
the same weights under two paths share chunks and other weights under one path do not. Without
``fingerprint`` (a hub id) ``model`` and ``revision`` decide, as before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from kvtier.errors import ConfigError
from kvtier.layout import KVLayout


@dataclass(frozen=True)
class CacheIdentity:
    """Model, revision (or weights digest), KV layout and any other KV-changing settings.

    ``extra`` holds further string settings (``{"rope_scaling": "yarn-4"}``); order does not matter.
    ``fingerprint`` is the content digest of the model's config and weights
    (``kvtier.model_fingerprint``); when set, ``model`` is a display name left out of the digest.
    """

    model: str
    layout: KVLayout
    revision: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)
    fingerprint: str = ""

    def __post_init__(self) -> None:
        """``ConfigError`` for a field of the wrong type, here rather than at the first key."""
        for name in ("model", "revision", "fingerprint"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"CacheIdentity.{name}: expected a string")
        if not isinstance(self.layout, KVLayout):
            raise ConfigError("CacheIdentity.layout: expected a KVLayout")
        extra = self.extra
        if not isinstance(extra, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in extra.items()
        ):
            raise ConfigError("CacheIdentity.extra: expected a mapping of strings to strings")

    def describe(self) -> dict[str, Any]:
        """A plain, human-readable description; written next to stored chunks.

        ``fingerprint`` appears only when set, so identities without one keep their digests.
        """
        description: dict[str, Any] = {
            "model": self.model,
            "revision": self.revision,
            "layout": self.layout.describe(),
            "extra": dict(sorted(self.extra.items())),
        }
        if self.fingerprint:
            description["fingerprint"] = self.fingerprint
        return description

    @cached_property
    def digest(self) -> bytes:
        """sha256 of the canonical JSON description (32 bytes), without ``model`` when a
        ``fingerprint`` stands for the model's content."""
        described = self.describe()
        if self.fingerprint:
            del described["model"]
        text = json.dumps(described, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).digest()

    @property
    def hexdigest(self) -> str:
        return self.digest.hex()

    def __eq__(self, other: object) -> bool:
        """Equal when the digests are: two display names of one fingerprint are one identity."""
        if not isinstance(other, CacheIdentity):
            return NotImplemented
        return self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)
