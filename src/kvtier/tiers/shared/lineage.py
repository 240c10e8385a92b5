"""Chunk lineage: which chunk comes before another in its prefix, carried with the chunk.

A prefix lookup reaches chunk ``i`` only through chunks ``0..i-1`` (keys are chained:
``kvtier.keys``), so a chunk whose predecessor is gone can never be served. To evict such
chunks first and cut a prefix from its tail, tiers and ``kvtier cache`` need each chunk's
predecessor, which its key does not reveal. The engine knows it when it stores a request's
chunks; it travels in ``TransferJob.links`` and is written into the chunk's header block, in
the padding every header format leaves unused (``LINK_OFFSET``), where readers of the payload
never look::

    offset        size  field
    2048          8     magic b"KVTLINK1"
    2056          32    parent key (zeros: none)
    2088          8     index in the chain (int64, -1: not known)
    2096          8     xxh3-64 of bytes 2048..2096

A link only orders eviction: it is never trusted for what a read returns. Files written before
links existed, or whose link is garbled, read as ``None``: a chunk with no known predecessor,
which is never taken for unreachable.

Thread safety: plain functions and an immutable dataclass.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

LINK_OFFSET = 2048
_MAGIC = b"KVTLINK1"
_BODY = struct.Struct("<8s32sq")
_CHECK = struct.Struct("<Q")
LINK_BYTES = _BODY.size + _CHECK.size
_NO_PARENT = bytes(32)


@dataclass(frozen=True)
class Link:
    """``parent``: the key of the chunk before this one in its prefix (``None``: the first of
    its chain, or not known); ``index``: its position in the chain (0 first, -1 not known)."""

    parent: bytes | None = None
    index: int = -1


def chain_links(
    keys: Sequence[bytes], first_index: int = 0, parent: bytes | None = None
) -> list[Link]:
    """Links of consecutive chunks ``keys`` of one prefix, ``keys[0]`` at ``first_index`` and
    preceded by ``parent`` (``None`` when ``keys[0]`` starts the chain or its parent is unknown)."""
    before: list[bytes | None] = [parent, *keys[:-1]]
    return [Link(p, first_index + i) for i, p in enumerate(before[: len(keys)])]


def encode_link(link: Link) -> bytes:
    """The ``LINK_BYTES`` bytes that ``put_link`` writes."""
    body = _BODY.pack(_MAGIC, link.parent or _NO_PARENT, link.index)
    return body + _CHECK.pack(xxhash.xxh3_64_intdigest(body))


def put_link(header: bytearray | memoryview, link: Link | None) -> None:
    """Write ``link`` into a header block (at least ``LINK_OFFSET + LINK_BYTES`` long); ``None``
    leaves the block as it is."""
    if link is not None:
        header[LINK_OFFSET : LINK_OFFSET + LINK_BYTES] = encode_link(link)


def linked(header: bytes, link: Link | None) -> bytes:
    """``header`` with ``link`` written into it (``header`` itself when ``link`` is ``None``)."""
    if link is None:
        return header
    block = bytearray(header)
    put_link(block, link)
    return bytes(block)


def read_link(header: bytes | bytearray | memoryview) -> Link | None:
    """The link in a header block, or ``LINK_BYTES`` bytes starting at ``LINK_OFFSET`` alone;
    ``None`` where there is none or it is garbled."""
    start = LINK_OFFSET if len(header) > LINK_BYTES else 0
    raw = bytes(header[start : start + LINK_BYTES])
    if len(raw) != LINK_BYTES or not raw.startswith(_MAGIC):
        return None
    body, (check,) = raw[: _BODY.size], _CHECK.unpack(raw[_BODY.size :])
    if xxhash.xxh3_64_intdigest(body) != check:
        return None
    _, parent, index = _BODY.unpack(body)
    return Link(None if parent == _NO_PARENT else parent, index)
