"""Object bodies: sealing a host slot into a put's body, and opening a get's header and payload.

``ObjectBodies`` keeps per-thread buffers, reused so that no request allocates one: the staging
buffer a put sends (header block, then the payload or its ciphertext: what is sent is what is
sealed, the copy and not the slot) and the header block a get streams into before its payload
goes straight on into the host slot. The header block also carries the chunk's link
(``tiers.shared.lineage``), outside what the seal covers: it only orders eviction.

Thread safety: any thread; each uses its own buffers (``threading.local``).
"""

from __future__ import annotations

import threading
from typing import Any

from kvtier.errors import IntegrityError
from kvtier.keys import ChunkKey
from kvtier.tiers.shared import codec
from kvtier.tiers.shared.lineage import Link, put_link
from kvtier.tiers.shared.sealing import Sealer


class ObjectBodies:
    """Seal and open the objects of identity ``digest`` with ``sealer``."""

    def __init__(self, sealer: Sealer, digest: bytes) -> None:
        self._sealer, self._digest = sealer, digest
        self._local = threading.local()

    def encode(self, key: ChunkKey, payload: memoryview, link: Link | None) -> memoryview:
        """Header (with ``link``) + ``payload`` (or its ciphertext) in this thread's staging
        buffer, valid until this thread's next ``encode``."""
        staging = getattr(self._local, "body", None)
        if staging is None or len(staging) != codec.HEADER_BYTES + len(payload):
            staging = self._local.body = memoryview(bytearray(codec.HEADER_BYTES + len(payload)))
        body = staging[codec.HEADER_BYTES :]
        if self._sealer.encrypts:  # the ciphertext lands in the staging buffer: no copy first
            header = self._sealer.seal(self._digest, key, payload, body)
        elif self._sealer.keyed:
            body[:] = payload
            header = self._sealer.seal(self._digest, key, body)
        else:  # hashed as it is copied: one pass over the slot
            digest = codec.copy_checksum(body, payload)
            header = self._sealer.seal(self._digest, key, body, None, digest)
        staging[: codec.HEADER_BYTES] = header
        put_link(staging[: codec.HEADER_BYTES], link)
        return staging

    def header_buffer(self) -> memoryview:
        """This thread's header block for a get."""
        header = getattr(self._local, "header", None)
        if header is None:
            header = self._local.header = memoryview(bytearray(codec.HEADER_BYTES))
        return header

    def filling(self, payload: memoryview) -> Any | None:
        """What a get feeds as the payload lands (``codec.filling``); ``None`` when a tag is
        checked instead of the checksum."""
        return None if self._sealer.keyed else codec.filling(payload)

    def open(
        self,
        header: memoryview,
        payload: memoryview,
        key: ChunkKey,
        size: int,
        filling: Any | None = None,
    ) -> None:
        """Verify (and decrypt in place) chunk ``key``, an object of ``size`` bytes, with
        ``filling`` (the one this payload was fed as it landed, whole) for its checksum;
        ``IntegrityError`` when it is not (``length``: not a header and this payload)."""
        expected = codec.HEADER_BYTES + len(payload)
        if size != expected:
            raise IntegrityError(f"object is {size} bytes, expected {expected}", "length")
        digest = None if filling is None else filling.digest(len(payload))
        self._sealer.open(header, payload, self._digest, key, digest)
