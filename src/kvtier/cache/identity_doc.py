"""What a namespace's ``identity.json`` says: the model, revision and layout behind a digest.

The fs tier writes ``{"format": "kvtier-fs", "digest": ..., "identity": {...}}``
(``kvtier.tiers.fs.namespace.describe``); the obj tier writes the identity's description
itself. Both are read here. Anything else (not JSON, not an object, a missing field) gives an
``IdentityInfo`` with ``problem`` set and ``?`` for what is unknown: never an exception.

Thread safety: plain functions and an immutable dataclass.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

#: ``IdentityInfo.problem`` of a namespace without identity.json (not damage: it may be a
#: foreign directory named like one, or a namespace a server has not described yet).
MISSING = "no identity.json"
#: identity.json is a few kilobytes; a larger one is not kvtier's.
MAX_BYTES = 1 << 20
#: The largest ``block_size`` or ``blocks_per_chunk`` taken from identity.json (larger: ``?``).
MAX_FACTOR = 1 << 31
#: What ``IdentityInfo`` shows for a field identity.json does not give, and for an empty one.
UNKNOWN, EMPTY = "?", "-"


@dataclass(frozen=True)
class IdentityInfo:
    """``layout_digest``: the first 12 hex digits of sha256 of the layout's canonical JSON."""

    model: str = "?"
    revision: str = "?"
    dtype: str = "?"
    layout_digest: str = "?"
    tokens_per_chunk: int | None = None
    problem: str | None = None

    def names_model(self, model: str) -> bool:
        """Whether identity.json names ``model`` (the placeholders ``?`` and ``-`` name none)."""
        return self.model == model and model not in (UNKNOWN, EMPTY)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "revision": self.revision,
            "dtype": self.dtype,
            "layout_digest": self.layout_digest,
            "tokens_per_chunk": self.tokens_per_chunk,
        }


def parse_identity(raw: bytes | None) -> IdentityInfo:
    """The description in ``raw`` (``None``: there is no identity.json)."""
    if raw is None:
        return IdentityInfo(problem=MISSING)
    if len(raw) > MAX_BYTES:
        return IdentityInfo(problem=f"identity.json is over {MAX_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        return IdentityInfo(problem=f"identity.json is not JSON ({str(exc)[:80]})")
    identity = doc.get("identity", doc) if isinstance(doc, dict) else None
    if not isinstance(identity, dict):
        return IdentityInfo(problem="identity.json is not an object")
    return _from_description(identity)


def _from_description(identity: dict[str, Any]) -> IdentityInfo:
    layout = identity.get("layout")
    if not isinstance(layout, dict):
        return IdentityInfo(_text(identity.get("model")), problem="identity.json has no layout")
    canonical = json.dumps(layout, sort_keys=True, separators=(",", ":"))
    return IdentityInfo(
        model=_text(identity.get("model")),
        revision=_text(identity.get("revision")),
        dtype=_text(layout.get("dtype")),
        layout_digest=hashlib.sha256(canonical.encode()).hexdigest()[:12],
        tokens_per_chunk=_tokens(layout),
    )


def _text(value: Any) -> str:
    return UNKNOWN if value is None else str(value) or EMPTY


def _tokens(layout: dict[str, Any]) -> int | None:
    """Tokens per chunk; ``None`` unless both factors are integers from 1 to ``MAX_FACTOR``."""
    block, blocks = _factor(layout.get("block_size")), _factor(layout.get("blocks_per_chunk"))
    return None if block is None or blocks is None else block * blocks


def _factor(value: Any) -> int | None:
    return value if type(value) is int and 1 <= value <= MAX_FACTOR else None


def problem_kind(info: IdentityInfo) -> str:
    """The counter for ``info.problem``: ``no_identity`` (benign) or ``bad_identity``."""
    return "no_identity" if info.problem == MISSING else "bad_identity"
