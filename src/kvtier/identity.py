"""CacheIdentity: what makes the bytes of two caches interchangeable.

Two instances may share chunks only if every input that decides the KV bytes is the same: the
model weights, the KV dtype and layout, and anything else that changes KV (RoPE scaling,
quantization). The identity's digest seeds the key chain and names the namespace of every tier.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from kvtier.layout import KVLayout


@dataclass(frozen=True)
class CacheIdentity:
    """Model, revision (or weights digest), KV layout and any other KV-changing settings.

    ``extra`` holds further string settings (``{"rope_scaling": "yarn-4"}``); order does not matter.
    """

    model: str
    layout: KVLayout
    revision: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """A plain, human-readable description; written next to stored chunks."""
        return {
            "model": self.model,
            "revision": self.revision,
            "layout": self.layout.describe(),
            "extra": dict(sorted(self.extra.items())),
        }

    @cached_property
    def digest(self) -> bytes:
        """sha256 of the canonical JSON description (32 bytes)."""
        text = json.dumps(self.describe(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).digest()

    @property
    def hexdigest(self) -> str:
        return self.digest.hex()

    def __hash__(self) -> int:
        return hash(self.digest)
