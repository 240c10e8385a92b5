"""Chunk keys: a chained sha256 over the token ids of each chunk's whole prefix.

``key[i] = sha256(key[i-1] || token_ids of chunk i)`` with ``key[-1]`` the identity digest (mixed
with a per-request salt when one is given, for tenant isolation). Token ids are hashed as
little-endian int64, so keys are the same on every process and machine. Only full chunks get keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvtier.identity import CacheIdentity

KEY_BYTES = 32


class ChunkKey(bytes):
    """The 32-byte key of one chunk. Hashable and cheap to compare; ``hex()`` names files."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"ChunkKey({self.hex()[:16]}…)"


def chain_seed(identity: CacheIdentity, salt: bytes | str | None = None) -> bytes:
    """The value ``key[-1]`` that starts a request's key chain."""
    if not salt:
        return identity.digest
    salt_bytes = salt.encode() if isinstance(salt, str) else bytes(salt)
    return hashlib.sha256(identity.digest + b"\x00salt\x00" + salt_bytes).digest()


def chunk_keys(
    token_ids: Sequence[int] | Any,
    identity: CacheIdentity,
    salt: bytes | str | None = None,
) -> list[ChunkKey]:
    """Keys of every full chunk of ``token_ids`` (a sequence, numpy array or CPU tensor)."""
    tokens = np.ascontiguousarray(np.asarray(token_ids, dtype="<i8").reshape(-1))
    per_chunk = identity.layout.tokens_per_chunk
    raw = tokens.tobytes()
    stride = per_chunk * 8
    prev = chain_seed(identity, salt)
    keys: list[ChunkKey] = []
    for start in range(0, (len(tokens) // per_chunk) * stride, stride):
        prev = hashlib.sha256(prev + raw[start : start + stride]).digest()
        keys.append(ChunkKey(prev))
    return keys
