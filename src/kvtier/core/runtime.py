"""Runtime: what decides, counts and answers the operator, for one engine, whichever path runs it.

Every engine path composes one runtime: ``TieringManager`` (kvtier's own host tier) and, under
vLLM, the kvtier tiers of one engine (``kvtier.integrations.vllm.engine``). A fix here lands on
both paths. The runtime owns:

* the secondary tiers and their jobs, submissions and results (``TierSet``);
* tier switches by hand and by the SLO guard (``TierControl``, ``SLOGuard``);
* the admission gate for every level (``Admission``);
* the counters and their metric definitions (``ManagerMetrics``);
* glibc malloc's thresholds, set once per process unless ``tune_malloc`` is false
  (``kvtier.core.malloc_settings``);
* the operator plane: ``/metrics`` with kvtier's metric names, and the loopback admin endpoint
  (``kvtier.control.admin``) when ``metrics_admin`` is set.

Thread safety: every public method takes ``lock`` (re-entrant). The engine path calls from its
scheduler thread and also takes ``lock`` around its own work; the metrics server's threads call
the operator methods and scrape the gauges under it. Nothing here waits on I/O.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from kvtier.config.checks import Label, listen_errors
from kvtier.config.schema import RuntimeConfig
from kvtier.control.admin import admin_app
from kvtier.control.admission import AdmissionConfig
from kvtier.control.admission.gate import Admission
from kvtier.control.slo_guard import SLOGuard, latency
from kvtier.control.tier_switches import TierControl, TierSwitch, check_switch
from kvtier.core import malloc_settings
from kvtier.core.entry_checks import serialized, under_lock
from kvtier.core.tier_set import Finished, TierSet
from kvtier.errors import ClosedError
from kvtier.keys import ChunkKey
from kvtier.telemetry.endpoint import MetricsServer
from kvtier.telemetry.metrics import GaugeSource, ManagerMetrics, TelemetryCollector
from kvtier.tiers.base import SecondaryTier

log = logging.getLogger(__name__)

#: A gauge read at scrape time: (help text, a function returning its series).
Gauges = dict[str, tuple[str, GaugeSource]]


class Runtime:
    """Tiers, switches, the SLO guard, admission, metrics and the operator plane (module doc).

    Built with its ``tiers`` (the manager's, all known at start: bound at once), or with none
    (``None``: vLLM's, which join one by one with ``add_tier``; ``bind`` once they are all
    there). Then ``serve`` starts the operator plane. ``close`` closes the tiers and the
    endpoint; a runtime that cannot bind its tiers closes them and raises.
    """

    def __init__(
        self,
        config: RuntimeConfig,
        chunk_bytes: int,
        tiers: Sequence[SecondaryTier] | None = None,
    ) -> None:
        self.config = config
        if config.tune_malloc:
            malloc_settings.apply()
        self._lock = threading.RLock()
        self._closed = False
        self.metrics = ManagerMetrics()
        self.tiers = TierSet(self.metrics, chunk_bytes, config.deadlines)
        guard = None if config.slo_guard is None else SLOGuard(config.slo_guard)
        self.control = TierControl(self.tiers, guard)
        self.admission = Admission((), (), self.metrics)
        self._given_names: list[str] = []
        self._tier_rules: dict[int, tuple[AdmissionConfig | None, int | None]] = {}
        self._exporter: MetricsServer | None = None
        self._last_offer: tuple[Hashable, frozenset[ChunkKey]] = (None, frozenset())
        if tiers is not None:
            self._bind_all(tiers)

    def _bind_all(self, tiers: Sequence[SecondaryTier]) -> None:
        """Add and bind ``tiers``; if that fails, every one of them is closed."""
        try:
            for tier in tiers:
                self.add_tier(tier)
            self.bind()
        except BaseException:
            self.close()
            for tier in tiers[len(self.tiers.tiers) :]:  # refused, or never reached
                with contextlib.suppress(Exception):
                    tier.close()
            raise

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    @property
    def closed(self) -> bool:
        return self._closed

    # -- building ----------------------------------------------------------------------------
    @serialized
    def add_tier(
        self,
        tier: SecondaryTier,
        admission: AdmissionConfig | None = None,
        min_priority: int | None = None,
    ) -> int:
        """Add ``tier`` (its index is returned); ``admission`` and ``min_priority`` are rules of
        its own (vLLM's per-tier entries), applied with the config's once ``bind`` runs.
        ``ConfigError`` for a name that is not a ``Label`` (however the tier was built)."""
        if self._closed:
            raise ClosedError("add_tier: the runtime is closed")
        Label().check(tier.name, "tier name")
        index = self.tiers.add(tier)
        self._given_names.append(tier.name)
        if admission is not None or min_priority is not None:
            self._tier_rules[index] = (admission, min_priority)
        return index

    @serialized
    def bind(self) -> None:
        """Tier names made unique and bound to the metrics; the admission gate built over them.

        ``ConfigError`` for an admission level that names no tier. Call again after more
        ``add_tier`` calls (the gate's sightings start over: call it before serving).
        """
        for tier, name in zip(self.tiers, self._given_names, strict=True):
            tier.name = name  # made unique anew over every tier, however many joined since
        self.tiers.bind()
        names = self.tiers.names()
        configs, floors = list(self.config.admission), {}
        for index, (config, floor) in self._tier_rules.items():
            if config is not None:
                configs.append(dataclasses.replace(config, level=names[index]))
            if floor is not None:
                floors[names[index]] = floor
        self.admission = Admission(
            configs, names, self.metrics, self.config.secondary_min_priority, floors
        )

    # -- admission ----------------------------------------------------------------------------
    @serialized
    def note_offer(self, keys: Sequence[ChunkKey], offer_id: Hashable = None) -> None:
        """An engine offered ``keys`` to a tier: one sighting each for admission. The engine's
        ``offer_id`` (``None``: a new offer) names one store offered to several tiers in a row
        (vLLM's cascade), which is one sighting."""
        offer = (offer_id, frozenset(keys))
        if offer_id is None or offer != self._last_offer:
            self._last_offer = offer
            self.admission.seen(keys)

    # -- jobs ----------------------------------------------------------------------------------
    @serialized
    def poll_tier(self, index: int) -> tuple[list[Finished], list[Any]]:
        """Tier ``index``'s finished jobs (fed to the SLO guard) and the keys it removed; the
        guard's decisions are applied first."""
        self.control.step()
        finished, removed = self.tiers.poll_tier(index)
        for job in finished:
            self.control.observe(job)
        return finished, removed

    # -- the operator's controls ---------------------------------------------------------------
    @serialized
    def disable_tier(self, name: str, reason: str = "manual") -> bool:
        """Switch tier ``name`` off: no lookups, promotions or writes until ``enable_tier``.

        Its jobs in flight still finish (or fail) safely. Returns whether anything changed.
        A tier switched by hand is never switched back on by the SLO guard. ``ClosedError``
        once closed; ``InvalidArgumentError`` for a ``name`` that is not a string or a
        ``reason`` that is not a string of 1 to 64 printable characters (it labels
        ``kvtier_tier_disabled_total``); ``KVTierError`` for no such tier.
        """
        return self._switch_by_hand(name, False, reason)

    @serialized
    def enable_tier(self, name: str) -> bool:
        """Switch tier ``name`` back on; whether anything changed (``ClosedError`` once closed)."""
        return self._switch_by_hand(name, True, "manual")

    def _switch_by_hand(self, name: str, enable: bool, reason: str) -> bool:
        check_switch(name, reason)
        if self._closed:
            raise ClosedError(f"{'enable' if enable else 'disable'}_tier: the manager is closed")
        return self.control.switch_by_hand(name, enable, reason)

    @serialized
    def tier_states(self) -> tuple[list[str], list[str]]:
        """Names of the enabled and of the switched-off tiers, each in config order."""
        return self.tiers.split_by_state()

    @serialized
    def report_request(self, ttft_s: float | None = None, itl_s: float | None = None) -> None:
        """A finished request's time to first token and inter-token latency, for the SLO guard;
        ``InvalidArgumentError`` unless each is ``None`` or a finite number >= 0, then
        ``ClosedError`` once closed (a closed runtime switches no tier)."""
        ttft, itl = latency("ttft_s", ttft_s), latency("itl_s", itl_s)
        if self._closed:
            raise ClosedError("report_request: the manager is closed")
        self.control.report_request(ttft, itl)

    @serialized
    def stats(self) -> dict[str, Any]:
        """Every counter (``name{labels}``), the pending jobs, and each tier's stats and state."""
        return {
            "counters": self.metrics.flat(),
            "pending_jobs": self.tiers.num_pending,
            "tiers": {tier.name: tier.stats() for tier in self.tiers},
            "disabled_tiers": self.tiers.split_by_state()[1],
        }

    @serialized
    def take_tier_switches(self) -> list[TierSwitch]:
        """Tiers switched on or off since the last call (by hand or by the SLO guard)."""
        return self.control.take_switches()

    # -- metrics and the endpoint ----------------------------------------------------------------
    def collector(self, gauges: Gauges) -> TelemetryCollector:
        """The counters and histograms, plus ``gauges`` and the runtime's own (every tier's
        stats, ``kvtier_tier_enabled``), each read under ``lock`` at scrape time."""
        own: Gauges = {
            "kvtier_tier_stat": ("Each tier's own stats() values", self._tier_stats),
            "kvtier_tier_enabled": (
                "1 while a tier serves, 0 while switched off",
                self.control.enabled_gauge,
            ),
        }
        every = {**gauges, **own}
        locked = {name: (doc, under_lock(self._lock, read)) for name, (doc, read) in every.items()}
        return TelemetryCollector(self.metrics.telemetry, locked)

    def _tier_stats(self) -> dict[Any, float]:
        return {
            (("stat", stat), ("tier", tier.name)): float(value)
            for tier in self.tiers
            for stat, value in tier.stats().items()
        }

    def registry(self, gauges: Gauges) -> Any:
        """A new prometheus-client ``CollectorRegistry`` exporting ``collector(gauges)``."""
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector(gauges))
        return registry

    def serve(self, gauges: Gauges, admin_target: Any = None) -> None:
        """Start ``/metrics`` (and ``/admin/...`` with ``metrics_admin``) on ``metrics_port``;
        nothing without one. ``admin_target`` answers the admin routes (default: this)."""
        port, host = self.config.metrics_port, self.config.metrics_host
        if port is None:
            return
        admin = admin_app(admin_target or self) if self.config.metrics_admin else None
        with listen_errors("metrics_host, metrics_port", f"{host}:{port}"):
            self._exporter = MetricsServer(self.registry(gauges), port, host, admin=admin)
        log.info(
            "kvtier metrics on http://%s:%d/metrics%s",
            host,
            port,
            " (admin endpoint on)" if admin else "",
        )

    @property
    def endpoint(self) -> MetricsServer | None:
        return self._exporter

    def close(self, close_tiers: bool = True) -> None:
        """Stop the endpoint, then close every tier (unless ``close_tiers`` is false: the
        engine path closes them itself). Idempotent; the operator methods then raise
        ``ClosedError``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        closables: Sequence[Callable[[], None]] = [
            *([self._exporter.close] if self._exporter is not None else []),
            *([t.close for t in self.tiers] if close_tiers else []),
        ]
        for close in closables:
            try:
                close()
            except Exception as exc:
                log.warning("closing %r failed: %s", close, exc)
