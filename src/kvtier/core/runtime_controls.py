"""RuntimeControls: what a manager forwards to its ``Runtime``, for operators.

Tier switches, the SLO guard's request reports and Prometheus export live in ``Runtime``; the
manager offers them under its own name. Every method may be called from any thread (``Runtime``
takes its own lock; the gauges are snapshots taken under the manager's lock).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtier.telemetry.metrics import TelemetryCollector, state_gauges

if TYPE_CHECKING:
    from kvtier.control.tier_switches import TierSwitch
    from kvtier.core.host_slots import HostTier
    from kvtier.core.runtime import Runtime


class RuntimeControls:
    """The operator's controls of a manager that has a ``runtime`` and a ``host`` tier."""

    runtime: Runtime
    host: HostTier

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
        """``Runtime.report_request``: a finished request's latencies, for the SLO guard
        (``ClosedError`` once closed)."""
        self.runtime.report_request(ttft_s, itl_s)

    def take_tier_switches(self) -> list[TierSwitch]:
        """Tiers switched on or off since the last call (by hand or by the SLO guard)."""
        return self.runtime.take_tier_switches()

    def prometheus_registry(self) -> Any:
        """A new ``CollectorRegistry`` exporting this manager's metrics (prometheus-client)."""
        return self.runtime.registry(state_gauges(self.host))

    def prometheus_collector(self) -> TelemetryCollector:
        """The collector behind ``prometheus_registry``, to register on a registry of your own
        (its gauges are snapshots taken under the manager's lock, on the scraping thread)."""
        return self.runtime.collector(state_gauges(self.host))
