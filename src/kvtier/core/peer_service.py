"""A peer server on the manager's thread: stepped at every ``poll`` (``Services``), seeing host
memory through ``ManagerPeerHost`` only, a narrow view of the manager (``PeerHost``).

Thread safety: none of its own; the manager calls it under its lock, and ``PeerServer.step``,
which calls the view, runs at ``poll``.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from kvtier.config.checks import key_path, listen_errors
from kvtier.core.host_slots import HostTier
from kvtier.keys import ChunkKey
from kvtier.telemetry.logs import ThrottledLog
from kvtier.telemetry.metrics import ManagerMetrics

if TYPE_CHECKING:
    from kvtier.identity import CacheIdentity
    from kvtier.region import HostRegion
    from kvtier.tiers.peer.config import ServeConfig
    from kvtier.tiers.peer.host_view import PeerHost
    from kvtier.tiers.peer.server import PeerServer

log = logging.getLogger(__name__)
warn = ThrottledLog(log)


class ManagerService(Protocol):
    """Work that must run on the manager's thread, e.g. a peer server reading host slots.

    ``step`` is called at every ``poll`` and must not block; ``close`` when the manager closes.
    """

    def step(self, host: PeerHost) -> None: ...

    def close(self) -> None: ...


class Services:
    """The manager's services, stepped in the order they were added; one failing is counted."""

    def __init__(self, metrics: ManagerMetrics) -> None:
        self._metrics = metrics
        self._services: list[ManagerService] = []

    def add(self, service: ManagerService) -> None:
        self._services.append(service)

    def step(self, host: PeerHost) -> None:
        for service in self._services:
            try:
                service.step(host)
            except Exception as exc:
                warn.warning(f"service:{id(service)}", "service %r failed: %s", service, exc)
                self._metrics.count("internal_errors", kind="service")

    def take(self) -> list[ManagerService]:
        """Every service, forgotten here (to close them)."""
        services, self._services = self._services, []
        return services


def close_all(closables: Sequence[Any]) -> None:
    """Close each (``None`` skipped); a failure is logged and the others still close."""
    for closable in filter(None, closables):
        try:
            closable.close()
        except Exception as exc:
            log.warning("%r failed to close: %s", closable, exc)


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

    def generation(self, slot: int) -> int:
        return self._host.generation(slot)

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


def open_peer_server(serve: ServeConfig, region: HostRegion, identity: CacheIdentity) -> PeerServer:
    """A peer server for ``serve``, listening, over ``region``; a listen failure is a
    ``ConfigError`` naming ``serve.host, serve.port``. pyzmq is imported only here."""
    from kvtier.tiers.peer.server import PeerServer

    with key_path("serve"), listen_errors("serve.host, serve.port", f"{serve.host}:{serve.port}"):
        return PeerServer(serve, region, identity)
