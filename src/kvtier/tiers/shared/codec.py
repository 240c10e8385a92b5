"""The on-media chunk format shared by every tier that stores bytes outside the process.

A stored chunk is a header block of ``HEADER_BYTES`` (4096, so the payload starts aligned and
O_DIRECT reads can land straight in a host slot) followed by the payload. The format version at
offset 8 says which header follows. Version 1, written without an integrity key (anyone can
compute its checksums)::

    offset  size  field
    0       8     magic b"KVTCHUNK"
    8       2     format version (1)
    10      2     checksum algorithm (1 = xxh3-128)
    12      4     header block length (4096)
    16      32    cache identity digest
    48      32    chunk key
    80      8     payload length
    88      16    payload checksum (xxh3-128)
    104     8     header checksum (xxh3-64 of bytes 0..104)
    112     ...   zero padding up to 4096

Version 2, sealed with an integrity key (``sealing``): an AES-256-GCM tag over bytes 0..128 and
the payload, under a key derived from the integrity key and the salt::

    offset  size  field
    0       8     magic b"KVTCHUNK"
    8       2     format version (2)
    10      2     algorithm (2 = AES-256-GCM tag, payload in the clear;
                             3 = AES-256-GCM, payload encrypted)
    12      4     header block length (4096)
    16      32    cache identity digest
    48      32    chunk key
    80      8     payload length
    88      8     key id (names the integrity key, not secret)
    96      32    salt (random, one per sealing)
    128     16    tag
    144     ...   zero padding up to 4096

Everything is little-endian. ``verify`` checks a version-1 header against what the reader
expects and the payload against its checksum; any mismatch raises ``IntegrityError`` with a
``reason``. ``sealing`` verifies version 2 (and answers version 1 under a key as ``unkeyed``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import xxhash

from kvtier.errors import IntegrityError

_checksum: ModuleType | None
try:  # the compiled XXH3-128 (``xxh3.h``): the GIL released, and copy and hash in one pass
    from kvtier.tiers.shared import _checksum
except ImportError:  # not built (no compiler at install, not Linux): the xxhash package
    _checksum = None
#: The calling convention used here; a module built from another ``_checksum.c`` (a stale
#: build in a working tree) is not used.
CHECKSUM_ABI = 2
if _checksum is not None and getattr(_checksum, "ABI", 1) != CHECKSUM_ABI:
    _checksum = None

#: Whether ``checksum`` and ``copy_checksum`` run compiled (same values either way).
COMPILED_CHECKSUM = _checksum is not None

MAGIC = b"KVTCHUNK"
FORMAT_VERSION = 1
SEALED_VERSION = 2
CHECKSUM_XXH3_128 = 1
#: Version 2 algorithms: a tag over header and payload; the same with the payload encrypted.
AES_GCM_TAG, AES_GCM_ENCRYPTED = 2, 3
HEADER_BYTES = 4096
_FIELDS = struct.Struct("<8sHHI32s32sQ16s")
_HEADER_CHECK = struct.Struct("<Q")
#: Where a version-1 header holds the payload checksum; its own checksum (xxh3-64 of every
#: byte before) follows. The compiled store fills both in (``fs/_fastio.c``).
CHECKSUM_AT = _FIELDS.size - 16
_USED = _FIELDS.size + _HEADER_CHECK.size
_PREFIX = struct.Struct("<8sH")
_SEALED = struct.Struct("<8sHHI32s32sQ8s32s")
#: Version 2: the tag follows the bytes it authenticates (``SEALED_AAD_BYTES`` of the header).
SEALED_AAD_BYTES = _SEALED.size
TAG_BYTES = 16


@dataclass(frozen=True)
class ChunkHeader:
    identity_digest: bytes
    key: bytes
    payload_len: int
    checksum: bytes


@dataclass(frozen=True)
class SealedHeader:
    """A version-2 header's fields; ``tag`` is not verified by decoding."""

    algorithm: int
    identity_digest: bytes
    key: bytes
    payload_len: int
    key_id: bytes
    salt: bytes
    tag: bytes


def checksum(payload: bytes | bytearray | memoryview) -> bytes:
    """xxh3-128 of the payload (16 bytes), computed with the GIL released."""
    if _checksum is not None:
        digest: bytes = _checksum.digest(payload)
        return digest
    return xxhash.xxh3_128_digest(payload)


def copy_checksum(target: memoryview, source: bytes | bytearray | memoryview) -> bytes:
    """Copy ``source`` into the start of ``target`` and return ``checksum(source)``.

    Compiled, each piece is hashed right after it is copied, while still in CPU cache: one pass
    over memory where a copy then a checksum make two. ``ValueError`` if it does not fit.
    """
    if _checksum is not None:
        digest: bytes = _checksum.copy_digest(target, source)
        return digest
    if len(source) > len(target):
        raise ValueError(f"copy_checksum: {len(source)} bytes do not fit in {len(target)}")
    target[: len(source)] = source
    return checksum(source)


class _SecondPass:
    """``filling``'s stand-in where the checksum is not compiled: one pass at the end."""

    def __init__(self, target: memoryview) -> None:
        self._target, self._filled = target, 0

    def feed(self, filled: int) -> None:
        if not 0 <= filled <= len(self._target):
            raise ValueError(f"Filling.feed: {filled} is outside the buffer")
        self._filled = max(self._filled, filled)

    def copy_in(self, source: bytes | bytearray | memoryview) -> None:
        piece = memoryview(source).cast("B")  # bytes, as the compiled copy counts them
        end = self._filled + len(piece)
        if self._target.readonly:
            raise ValueError("Filling.copy_in: the target is read-only")
        if end > len(self._target):
            raise ValueError(f"Filling.copy_in: the bytes do not fit ({len(piece)} bytes)")
        self._target[self._filled : end] = piece
        self._filled = end

    def digest(self, length: int) -> bytes:
        return checksum(self._target[:length])


def filling(target: memoryview) -> Any:
    """The checksum of ``target`` as it fills from its start in pieces (a stream landing in a
    host slot): call ``feed(filled)`` after each piece, while it is still in CPU cache, or
    ``copy_in(source)`` to copy a piece held elsewhere in at the fill mark (the longest prefix
    fed), then ``digest(length)`` for ``checksum(target[:length])``. Compiled, each whole block
    is hashed once, as it arrives (``copy_in``: right after its copy, one pass over memory);
    else ``digest`` hashes the prefix then. ``copy_in`` raises ``ValueError`` when the piece
    does not fit or the target is read-only. For one thread at a time (compiled, a call while
    another thread is in one raises ``RuntimeError``)."""
    return _SecondPass(target) if _checksum is None else _checksum.Filling(target)


def encode_header(
    identity_digest: bytes,
    key: bytes,
    payload: bytes | bytearray | memoryview,
    payload_checksum: bytes | None = None,
) -> bytes:
    """The ``HEADER_BYTES`` header block for ``payload`` (``payload_checksum`` if already known)."""
    digest = checksum(payload) if payload_checksum is None else payload_checksum
    fields = _FIELDS.pack(
        MAGIC,
        FORMAT_VERSION,
        CHECKSUM_XXH3_128,
        HEADER_BYTES,
        identity_digest,
        key,
        len(payload),
        digest,
    )
    check = _HEADER_CHECK.pack(xxhash.xxh3_64_intdigest(fields))
    return fields + check + bytes(HEADER_BYTES - _USED)


def decode_header(block: bytes | bytearray | memoryview) -> ChunkHeader:
    """Parse a header block; raises ``IntegrityError`` when it is not a valid kvtier header."""
    if len(block) < _USED:
        raise IntegrityError(f"header is {len(block)} bytes, expected {HEADER_BYTES}", "short")
    magic, version, algorithm, length, identity, key, payload_len, digest = _FIELDS.unpack_from(
        block
    )
    if magic != MAGIC:
        raise IntegrityError("not a kvtier chunk (bad magic)", "magic")
    if version != FORMAT_VERSION or algorithm != CHECKSUM_XXH3_128 or length != HEADER_BYTES:
        raise IntegrityError(f"unsupported chunk format version {version}", "version")
    (stored_check,) = _HEADER_CHECK.unpack_from(block, _FIELDS.size)
    if stored_check != xxhash.xxh3_64_intdigest(bytes(block[: _FIELDS.size])):
        raise IntegrityError("header checksum mismatch", "header")
    return ChunkHeader(identity, key, payload_len, digest)


def verify(
    block: bytes | bytearray | memoryview,
    payload: bytes | bytearray | memoryview,
    identity_digest: bytes,
    key: bytes,
    payload_checksum: bytes | None = None,
) -> None:
    """Raise ``IntegrityError`` unless ``block`` + ``payload`` is chunk ``key`` of the identity.

    ``payload_checksum``: the payload's ``checksum``, when the caller computed it while reading.
    """
    header = decode_header(block)
    if header.identity_digest != identity_digest:
        raise IntegrityError("chunk belongs to another cache identity", "identity")
    if header.key != key:
        raise IntegrityError("chunk holds another key", "key")
    if header.payload_len != len(payload):
        raise IntegrityError(
            f"payload is {len(payload)} bytes, header says {header.payload_len}", "length"
        )
    digest = checksum(payload) if payload_checksum is None else payload_checksum
    if digest != header.checksum:
        raise IntegrityError("payload checksum mismatch", "checksum")


def format_version(block: bytes | bytearray | memoryview) -> int:
    """The format version of a header block; ``IntegrityError`` if it is no kvtier header."""
    if len(block) < _USED:
        raise IntegrityError(f"header is {len(block)} bytes, expected {HEADER_BYTES}", "short")
    magic, version = _PREFIX.unpack_from(block)
    if magic != MAGIC:
        raise IntegrityError("not a kvtier chunk (bad magic)", "magic")
    return int(version)


def encode_sealed(
    algorithm: int,
    identity_digest: bytes,
    key: bytes,
    payload_len: int,
    key_id: bytes,
    salt: bytes,
) -> bytearray:
    """A version-2 header block with a zero tag: bytes ``0..SEALED_AAD_BYTES`` are what the
    tag authenticates; the caller computes the tag and puts it there (``put_tag``)."""
    block = bytearray(HEADER_BYTES)
    fields = (MAGIC, SEALED_VERSION, algorithm, HEADER_BYTES, identity_digest, key)
    _SEALED.pack_into(block, 0, *fields, payload_len, key_id, salt)
    return block


def put_tag(block: bytearray, tag: bytes) -> None:
    """Store ``tag`` (``TAG_BYTES``) in a header made by ``encode_sealed``."""
    block[SEALED_AAD_BYTES : SEALED_AAD_BYTES + TAG_BYTES] = tag


def decode_sealed(block: bytes | bytearray | memoryview) -> SealedHeader:
    """Parse a version-2 header block; ``IntegrityError`` when it is not one."""
    if format_version(block) != SEALED_VERSION:
        raise IntegrityError("not a sealed (version 2) chunk header", "version")
    _, _, algorithm, length, identity, key, payload_len, key_id, salt = _SEALED.unpack_from(block)
    if algorithm not in (AES_GCM_TAG, AES_GCM_ENCRYPTED) or length != HEADER_BYTES:
        raise IntegrityError(f"unsupported sealing algorithm {algorithm}", "version")
    tag = bytes(block[SEALED_AAD_BYTES : SEALED_AAD_BYTES + TAG_BYTES])
    return SealedHeader(algorithm, identity, key, payload_len, key_id, salt, tag)
