"""ServedSeals: the header each chunk a peer server sends goes out with.

A fetched chunk is sealed (``shared.sealing``) on the server thread, from its host slot. Two
rules make that safe and cheap:

* A slot the server does not hold (beyond the client's hold budget) may be evicted and
  allocated to another chunk before the server thread reads it; sealing those bytes under the
  old key would make another chunk's KV verify as this one. So each fetch records the slot's
  generation (``HostTier.generation``) on the manager's thread, and a seal counts only if the
  generation is the same once the bytes are sealed (a sequence lock): else the chunk is not
  sent (``fetch_slot_reused``), a miss for the client.
* A chunk's bytes do not change while its slot keeps its generation, so without an integrity
  key its payload checksum is taken once per residency and kept (16 bytes per slot): a chunk
  fetched by many peers is hashed once, not once per fetch. A keyed seal (a tag) is made each
  time.

Thread safety: the server thread only.
"""

from __future__ import annotations

from collections.abc import Callable

from kvtier.keys import ChunkKey
from kvtier.tiers.shared import codec
from kvtier.tiers.shared.sealing import Sealer


class ServedSeals:
    """Headers for chunks served out of host slots, sealed with ``sealer`` for cache
    ``digest``; see the module docstring."""

    def __init__(self, sealer: Sealer, digest: bytes) -> None:
        self._sealer, self._digest = sealer, digest
        self._checksums: dict[int, tuple[int, ChunkKey, bytes]] = {}  # slot -> residency's

    def header(
        self,
        key: ChunkKey,
        view: memoryview,
        slot: int,
        stamp: int,
        generation: Callable[[int], int],
    ) -> bytes | None:
        """The header for chunk ``key`` read from ``view`` (host ``slot``, of generation
        ``stamp`` when the fetch was answered); ``None`` when ``generation(slot)`` moved on
        before it was sealed (the bytes may be another chunk's: do not send them)."""
        checksum = None if self._sealer.keyed else self._checksum(key, view, slot, stamp)
        header = self._sealer.seal(self._digest, key, view, None, checksum)
        if generation(slot) != stamp:
            self._checksums.pop(slot, None)
            return None
        if checksum is not None:
            self._checksums[slot] = (stamp, key, checksum)
        return header

    def _checksum(self, key: ChunkKey, view: memoryview, slot: int, stamp: int) -> bytes:
        """The payload checksum kept for this residency of ``key`` in ``slot``, else a new one."""
        kept = self._checksums.get(slot)
        if kept is not None and kept[:2] == (stamp, key):
            return kept[2]
        return codec.checksum(view)
