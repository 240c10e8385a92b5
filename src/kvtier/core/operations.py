"""Operations: what an operator asks of a manager besides serving, mixed into ``TieringManager``.

Switching tiers off and on at run time (by hand; the SLO guard does it by itself), feeding the
guard request latencies, and reading what happened: stats, Prometheus metrics, KV events and
tier switches. The controls are the manager's ``Runtime``'s (``kvtier.core.runtime``), the same
object the vLLM adapter uses; what this adds is host memory's view. Every method takes the
manager's lock (the runtime's), so any thread may call it.
"""

from __future__ import annotations

import threading
from typing import Any

from kvtier.control.tier_switches import TierSwitch
from kvtier.core.entry_checks import serialized
from kvtier.core.host_slots import HostTier
from kvtier.core.runtime import Runtime
from kvtier.region import HostRegion
from kvtier.telemetry.kv_events import EventLog, KVEvent
from kvtier.telemetry.metrics import TelemetryCollector, state_gauges


class Operations:
    """The operator-facing half of ``TieringManager`` (which provides these attributes)."""

    _lock: threading.RLock
    _closed: bool
    _events: EventLog
    runtime: Runtime
    host: HostTier
    region: HostRegion

    # -- tiers at run time (``Runtime``'s controls) -------------------------------------------
    def disable_tier(self, name: str, reason: str = "manual") -> bool:
        """``Runtime.disable_tier``: switch tier ``name`` off until ``enable_tier``."""
        return self.runtime.disable_tier(name, reason)

    def enable_tier(self, name: str) -> bool:
        """``Runtime.enable_tier``: switch tier ``name`` back on."""
        return self.runtime.enable_tier(name)

    def tier_states(self) -> tuple[list[str], list[str]]:
        """Names of the enabled and of the switched-off tiers, each in config order."""
        return self.runtime.tier_states()

    def report_request(self, ttft_s: float | None = None, itl_s: float | None = None) -> None:
        """``Runtime.report_request``: a finished request's latencies, for the SLO guard."""
        self.runtime.report_request(ttft_s, itl_s)

    def take_tier_switches(self) -> list[TierSwitch]:
        """Tiers switched on or off since the last call (by hand or by the SLO guard)."""
        return self.runtime.take_tier_switches()

    # -- what happened ---------------------------------------------------------------------
    @serialized
    def take_events(self) -> list[KVEvent]:
        """Events since the last call, oldest first."""
        return self._events.take()

    @serialized
    def stats(self) -> dict[str, Any]:
        """A snapshot: host occupancy, every counter (``name{labels}``), and each tier's stats."""
        tiers = self.runtime.tiers
        return {
            "host": {**self.host.snapshot(), "slot_bytes": self.region.slot_bytes},
            "counters": self.runtime.metrics.flat(),
            "pending_jobs": tiers.num_pending,
            "events_dropped": self._events.dropped,
            "tiers": {tier.name: tier.stats() for tier in tiers},
            "disabled_tiers": tiers.split_by_state()[1],
        }

    def prometheus_registry(self) -> Any:
        """A new ``CollectorRegistry`` exporting this manager's metrics (prometheus-client)."""
        return self.runtime.registry(state_gauges(self.host))

    def prometheus_collector(self) -> TelemetryCollector:
        """The collector behind ``prometheus_registry``, to register on a registry of your own.

        Its gauges are snapshots taken under the manager's lock (a scrape runs on the HTTP
        server's thread, while the engine's thread changes the host tier).
        """
        return self.runtime.collector(state_gauges(self.host))
