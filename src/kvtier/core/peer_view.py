"""ManagerPeerHost: the ``PeerHost`` a manager hands its peer server (a narrow view of itself).

Thread safety: its methods are called from ``PeerServer.step``, which runs at ``poll`` under the
manager's lock.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

from kvtier.core.host_slots import HostTier
from kvtier.keys import ChunkKey


class _Plan(Protocol):
    @property
    def keys(self) -> list[ChunkKey]: ...

    @property
    def slots(self) -> list[int]: ...


class Manager(Protocol):
    """What the view needs of ``TieringManager``."""

    host: HostTier

    def prepare_store(self, keys: Sequence[ChunkKey], /) -> _Plan | None: ...

    def complete_store(self, keys: Sequence[ChunkKey], /, success: bool = True) -> None: ...

    def promote_for_peer(self, keys: Sequence[ChunkKey], /) -> set[ChunkKey]: ...

    @property
    def num_pending_jobs(self) -> int: ...


class ManagerPeerHost:
    """``kvtier.tiers.peer.host_view.PeerHost`` over ``manager``."""

    def __init__(self, manager: Manager) -> None:
        self._manager, self._host = manager, manager.host

    def is_ready(self, key: ChunkKey) -> bool:
        return self._host.is_ready(key)

    def slot_of(self, key: ChunkKey) -> int:
        return self._host.slot_of(key)

    def touch(self, keys: Sequence[ChunkKey]) -> None:
        self._host.touch(keys)

    def hold(self, keys: Sequence[ChunkKey], owner: Hashable) -> list[int]:
        return self._host.hold(keys, owner)

    def can_release(self, keys: Sequence[ChunkKey], owner: Hashable) -> bool:
        return self._host.can_release(keys, owner)

    def release(self, keys: Sequence[ChunkKey], owner: Hashable) -> None:
        self._host.release(keys, owner)

    def reserve(self, keys: Sequence[ChunkKey]) -> tuple[list[ChunkKey], list[int]] | None:
        plan = self._manager.prepare_store(keys)
        return None if plan is None else (plan.keys, plan.slots)

    def complete(self, keys: Sequence[ChunkKey]) -> None:
        self._manager.complete_store(keys, success=True)

    def promote(self, keys: Sequence[ChunkKey]) -> set[ChunkKey]:
        return self._manager.promote_for_peer(keys)

    @property
    def busy(self) -> bool:
        return self._manager.num_pending_jobs > 0
