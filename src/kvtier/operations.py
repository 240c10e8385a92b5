"""Operations: what an operator asks of a manager besides serving, mixed into ``TieringManager``.

Switching tiers off and on at run time (by hand; the SLO guard does it by itself), feeding the
guard request latencies, and reading what happened: stats, Prometheus metrics, KV events and
tier switches. Every method takes the manager's lock, so any thread may call it; Prometheus
gauges are snapshots taken under it too.
"""

from __future__ import annotations

import threading
from typing import Any

from kvtier.errors import ClosedError
from kvtier.events import EventLog, KVEvent
from kvtier.guards import serialized, under_lock
from kvtier.host import HostTier
from kvtier.metrics import ManagerMetrics, TelemetryCollector, state_gauges
from kvtier.region import HostRegion
from kvtier.slo import latency
from kvtier.tier_control import TierControl, TierSwitch, check_switch
from kvtier.tier_set import TierSet
from kvtier.tiers.base import SecondaryTier


class Operations:
    """The operator-facing half of ``TieringManager`` (which provides these attributes)."""

    _lock: threading.RLock
    _closed: bool
    _control: TierControl
    _events: EventLog
    _tiers: TierSet
    metrics: ManagerMetrics
    host: HostTier
    region: HostRegion
    tiers: list[SecondaryTier]

    # -- tiers at run time ---------------------------------------------------------------
    @serialized
    def disable_tier(self, name: str, reason: str = "manual") -> bool:
        """Switch tier ``name`` off: no lookups, promotions or writes until ``enable_tier``.

        Its jobs in flight still finish (or fail) safely. Returns whether anything changed.
        A tier switched by hand is never switched back on by the SLO guard. ``ClosedError``
        once the manager is closed (its tiers are); ``InvalidArgumentError`` for a ``name``
        that is not a string or a ``reason`` that is not a string of 1 to 64 characters (it
        labels ``kvtier_tier_disabled_total``); ``KVTierError`` for no such tier.
        """
        return self._switch_by_hand(name, False, reason)

    @serialized
    def enable_tier(self, name: str) -> bool:
        """Switch tier ``name`` back on; returns whether anything changed (``ClosedError``
        once the manager is closed)."""
        return self._switch_by_hand(name, True, "manual")

    def _switch_by_hand(self, name: str, enable: bool, reason: str) -> bool:
        check_switch(name, reason)
        if self._closed:
            raise ClosedError(f"{'enable' if enable else 'disable'}_tier: the manager is closed")
        return self._control.switch_by_hand(name, enable, reason)

    @serialized
    def tier_states(self) -> tuple[list[str], list[str]]:
        """Names of the enabled and of the switched-off tiers, each in config order."""
        return self._tiers.split_by_state()

    @serialized
    def report_request(self, ttft_s: float | None = None, itl_s: float | None = None) -> None:
        """A finished request's time to first token and inter-token latency, for the SLO guard;
        ``InvalidArgumentError`` unless each is ``None`` or a finite number >= 0."""
        self._control.report_request(latency("ttft_s", ttft_s), latency("itl_s", itl_s))

    @serialized
    def take_tier_switches(self) -> list[TierSwitch]:
        """Tiers switched on or off since the last call (by hand or by the SLO guard)."""
        return self._control.take_switches()

    # -- what happened ---------------------------------------------------------------------
    @serialized
    def take_events(self) -> list[KVEvent]:
        """Events since the last call, oldest first."""
        return self._events.take()

    @serialized
    def stats(self) -> dict[str, Any]:
        """A snapshot: host occupancy, every counter (``name{labels}``), and each tier's stats."""
        return {
            "host": {**self.host.snapshot(), "slot_bytes": self.region.slot_bytes},
            "counters": self.metrics.flat(),
            "pending_jobs": self._tiers.num_pending,
            "events_dropped": self._events.dropped,
            "tiers": {tier.name: tier.stats() for tier in self.tiers},
            "disabled_tiers": self._tiers.split_by_state()[1],
        }

    def prometheus_registry(self) -> Any:
        """A new ``CollectorRegistry`` exporting this manager's metrics (prometheus-client)."""
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.prometheus_collector())
        return registry

    def prometheus_collector(self) -> TelemetryCollector:
        """The collector behind ``prometheus_registry``, to register on a registry of your own.

        Its gauges are snapshots taken under the manager's lock (a scrape runs on the HTTP
        server's thread, while the engine's thread changes the host tier).
        """
        gauges = state_gauges(self.host, self.tiers)
        gauges["kvtier_tier_enabled"] = ("1 while a tier serves, 0 while switched off",
                                         self._control.enabled_gauge)  # fmt: skip
        locked = {name: (doc, under_lock(self._lock, read)) for name, (doc, read) in gauges.items()}
        return TelemetryCollector(self.metrics.telemetry, locked)
