"""Services: work that runs on the manager's thread at every ``poll`` (e.g. a peer server),
seeing host memory through ``PeerHost`` only.

Thread safety: none of its own; the manager calls it under its lock.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from kvtier.telemetry.logs import ThrottledLog
from kvtier.telemetry.metrics import ManagerMetrics

if TYPE_CHECKING:
    from kvtier.tiers.peer.host_view import PeerHost

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
