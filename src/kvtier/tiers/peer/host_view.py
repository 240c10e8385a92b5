"""PeerHost: all a peer server may do with this instance's host memory.

The peer server never sees the manager: it is handed this narrow view (``kvtier.core.peer_service``
implements it over a ``TieringManager``) and calls it on the manager's thread only, under the
manager's lock, from ``PeerServer.step``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

from kvtier.keys import ChunkKey


class PeerHost(Protocol):
    """Read, hold, reserve, complete and promote host chunks on behalf of peers."""

    def is_ready(self, key: ChunkKey) -> bool:
        """Whether ``key`` is in host memory and readable."""
        ...

    def slot_of(self, key: ChunkKey) -> int:
        """The host slot of a ready key."""
        ...

    def generation(self, slot: int) -> int:
        """How many times ``slot`` was allocated (``HostTier.generation``); the one call any
        thread may make: a server thread checks that bytes it read are still the chunk's."""
        ...

    def touch(self, keys: Sequence[ChunkKey]) -> None:
        """Recency for chunks a peer fetched."""
        ...

    def hold(self, keys: Sequence[ChunkKey], owner: Hashable) -> list[int]:
        """Keep ready ``keys`` from eviction until ``release``; their slots."""
        ...

    def can_release(self, keys: Sequence[ChunkKey], owner: Hashable) -> bool: ...

    def release(self, keys: Sequence[ChunkKey], owner: Hashable) -> None: ...

    def reserve(self, keys: Sequence[ChunkKey]) -> tuple[list[ChunkKey], list[int]] | None:
        """Slots to write chunks a peer stores (``prepare_store``); ``None`` if host is full."""
        ...

    def complete(self, keys: Sequence[ChunkKey]) -> None:
        """The reserved slots hold the peer's verified bytes (``complete_store``)."""
        ...

    def promote(self, keys: Sequence[ChunkKey]) -> set[ChunkKey]:
        """Start bringing keys only this instance's storage tiers hold into host memory."""
        ...

    @property
    def busy(self) -> bool:
        """Whether tier jobs are pending (promotions may land without any request)."""
        ...
