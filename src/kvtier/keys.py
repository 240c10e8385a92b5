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

from kvtier.errors import InvalidKeyError
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
    *,
    known: Sequence[ChunkKey] = (),
) -> list[ChunkKey]:
    """Keys of every full chunk of ``token_ids`` (a sequence, numpy array or CPU tensor).

    ``known``: keys this function gave for a prefix of ``token_ids`` under the same ``identity``
    and ``salt`` (a prompt's, when keying the prompt and its reply). They are taken as they are
    and the chain goes on from the last one, so only the chunks after them are hashed. The
    caller vouches for them: after keys of another prefix come that prefix's continuations.
    ``InvalidKeyError`` for a known key that is not 32 bytes.
    """
    tokens = token_array(token_ids)
    per_chunk = identity.layout.tokens_per_chunk
    raw = tokens.tobytes()
    stride = per_chunk * 8
    keys = list(known[: len(tokens) // per_chunk])
    if not all(isinstance(key, bytes) and len(key) == KEY_BYTES for key in keys):
        raise InvalidKeyError("chunk_keys: every known key must be 32 bytes")
    keys = [key if type(key) is ChunkKey else ChunkKey(key) for key in keys]
    prev = keys[-1] if keys else chain_seed(identity, salt)
    for start in range(len(keys) * stride, (len(tokens) // per_chunk) * stride, stride):
        prev = hashlib.sha256(prev + raw[start : start + stride]).digest()
        keys.append(ChunkKey(prev))
    return keys


def token_array(token_ids: Sequence[int] | Any) -> np.ndarray[Any, np.dtype[np.int64]]:
    """``token_ids`` as contiguous little-endian int64; ``InvalidKeyError`` for anything that
    is not integers from -2**63 to 2**63 - 1 (a float such as 1.5 would be cut to 1, and a
    uint64 past 2**63 would wrap: either would give another prompt's keys)."""
    try:
        given = np.asarray(token_ids)
        kind = given.dtype.kind
        if kind == "f" and not (np.isfinite(given).all() and (np.trunc(given) == given).all()):
            raise ValueError("not integers")
        if kind == "u" and given.size and given.max() > np.iinfo(np.int64).max:
            raise ValueError("past 2**63 - 1")
        tokens = given.astype("<i8", copy=False).reshape(-1)  # Python ints past int64 raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidKeyError(f"chunk_keys: token_ids must be integers ({exc})") from None
    return np.ascontiguousarray(tokens)
