"""Telemetry: what the manager and its tiers did, counted once, exported to Prometheus.

The manager and every tier count into one ``Telemetry`` (plain Python, guarded by a lock, no
Prometheus objects on the data path). ``stats()`` reads it, and ``TelemetryCollector`` turns it
into Prometheus families at scrape time, on a registry passed in explicitly. A tier registers
its own counters, histograms and gauges through the ``TierMetrics`` handle it is given; they are
exported as ``kvtier_tier_<name>{tier="<tier name>", ...}`` with the rest.

Thread safety: every method may be called from any thread.
"""

from __future__ import annotations

import bisect
import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

#: Seconds; spans a page-cache hit (tens of µs) to a slow object store (seconds).
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip

Labels = tuple[tuple[str, str], ...]


def labels_key(labels: Mapping[str, str]) -> Labels:
    """The key of a series: its labels, sorted by name."""
    return tuple(sorted(labels.items()))


@dataclass
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1


@dataclass(frozen=True)
class Family:
    """One metric family: its kind (``counter``, ``gauge``, ``histogram``) and help text."""

    kind: str
    doc: str


class Telemetry:
    """Counters, gauges and histograms keyed by family name and label set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.families: dict[str, Family] = {}
        self.values: dict[str, dict[Labels, float]] = {}
        self.histograms: dict[str, dict[Labels, Histogram]] = {}

    def declare(self, name: str, kind: str, doc: str) -> None:
        with self._lock:
            self.families.setdefault(name, Family(kind, doc))
            (self.histograms if kind == "histogram" else self.values).setdefault(name, {})

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        self.add(name, labels_key(labels), amount)

    def add(self, name: str, key: Labels, amount: float = 1) -> None:
        """``inc`` with the labels given as their key (``labels_key``): for hot paths that
        count the same series again and again."""
        with self._lock:
            series = self.values[name]
            series[key] = series.get(key, 0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self.values[name][labels_key(labels)] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        key = labels_key(labels)
        with self._lock:
            self.histograms[name].setdefault(key, Histogram()).observe(value)

    def get(self, name: str, **labels: str) -> float:
        with self._lock:
            return self.values.get(name, {}).get(labels_key(labels), 0)

    def snapshot(self) -> dict[str, dict[Labels, float]]:
        with self._lock:
            return {name: dict(series) for name, series in self.values.items()}

    def histogram_snapshot(self) -> dict[str, dict[Labels, Histogram]]:
        with self._lock:
            return {
                name: {
                    k: Histogram(h.buckets, list(h.counts), h.total, h.count)
                    for k, h in series.items()
                }
                for name, series in self.histograms.items()
            }


class TierMetric:
    """A metric a tier registered; every sample carries the tier's name as a label."""

    def __init__(self, telemetry: Telemetry, name: str, tier: str) -> None:
        self._telemetry, self._name, self._tier = telemetry, name, tier

    def inc(self, amount: float = 1, **labels: str) -> None:
        self._telemetry.inc(self._name, amount, tier=self._tier, **labels)

    def set(self, value: float, **labels: str) -> None:
        self._telemetry.set(self._name, value, tier=self._tier, **labels)

    def observe(self, value: float, **labels: str) -> None:
        self._telemetry.observe(self._name, value, tier=self._tier, **labels)


class TierMetrics:
    """The handle a tier registers its metrics through: ``kvtier_tier_<name>{tier=...}``."""

    def __init__(self, telemetry: Telemetry, tier: str) -> None:
        self.telemetry, self.tier = telemetry, tier

    def _register(self, name: str, kind: str, doc: str) -> TierMetric:
        full = f"kvtier_tier_{name}"
        self.telemetry.declare(full, kind, doc)
        return TierMetric(self.telemetry, full, self.tier)

    def counter(self, name: str, doc: str) -> TierMetric:
        return self._register(name, "counter", doc)

    def gauge(self, name: str, doc: str) -> TierMetric:
        return self._register(name, "gauge", doc)

    def histogram(self, name: str, doc: str) -> TierMetric:
        return self._register(name, "histogram", doc)


GaugeSource = Callable[[], Mapping[Labels, float]]


class TelemetryCollector:
    """A Prometheus collector over a ``Telemetry`` plus gauges computed at scrape time."""

    def __init__(self, telemetry: Telemetry, gauges: Mapping[str, tuple[str, GaugeSource]]):
        self.telemetry, self.gauges = telemetry, gauges

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        families = dict(self.telemetry.families)
        for name, series in self.telemetry.snapshot().items():
            family = families[name]
            cls = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            yield _filled(
                cls(name.removesuffix("_total"), family.doc, labels=_names(series)), series
            )
        for name, hseries in self.telemetry.histogram_snapshot().items():
            metric = HistogramMetricFamily(name, families[name].doc, labels=_names(hseries))
            for labels, hist in hseries.items():
                metric.add_metric([v for _, v in labels], _buckets(hist), hist.total)
            yield metric
        for name, (doc, source) in self.gauges.items():
            series = dict(source())
            yield _filled(GaugeMetricFamily(name, doc, labels=_names(series)), series)


def _names(series: Mapping[Labels, Any]) -> list[str]:
    first = next(iter(series), ())
    return [k for k, _ in first]


def _filled(metric: Any, series: Mapping[Labels, float]) -> Any:
    for labels, value in series.items():
        metric.add_metric([v for _, v in labels], value)
    return metric


def _buckets(hist: Histogram) -> list[tuple[str, float]]:
    cumulative, out = 0, list[tuple[str, float]]()
    for bound, count in zip((*hist.buckets, float("inf")), hist.counts, strict=True):
        cumulative += count
        out.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
    return out


class HostView(Protocol):
    num_slots: int

    @property
    def num_free(self) -> int: ...

    @property
    def num_held(self) -> int: ...

    def __len__(self) -> int: ...


def state_gauges(host: HostView) -> dict[str, tuple[str, GaugeSource]]:
    """Gauges of host memory read at scrape time: slots by state, and host fill."""

    def slots() -> dict[Labels, float]:
        held, used = host.num_held, len(host)
        states = {"free": host.num_free, "held": held, "evictable": used - held}
        return {(("state", state),): value for state, value in states.items()}

    return {
        "kvtier_host_slots": ("Host slots by state", slots),
        "kvtier_host_fill_ratio": (
            "Share of host slots holding a chunk",
            lambda: {(): len(host) / host.num_slots},
        ),
    }


class DelegatingCollector:
    """Collects from whichever collector is ``current`` (e.g. the manager the bench runs now)."""

    def __init__(self) -> None:
        self.current: TelemetryCollector | None = None

    def collect(self) -> Iterator[Any]:
        return iter(()) if self.current is None else self.current.collect()


#: The HTTP endpoint's families (``telemetry/endpoint.py``): (name, kind, help).
ENDPOINT_FAMILIES = (
    ("kvtier_endpoint_connections_dropped_total", "counter", "Connections closed unanswered"),
    ("kvtier_endpoint_connections_open", "gauge", "Connections open on the metrics endpoint"),
)

#: Why the endpoint closed a connection unanswered; each is counted under exactly one.
ENDPOINT_DROP_REASONS = (
    "read_deadline",  # no whole request head within the deadline (idle, slowloris)
    "limit",  # the connection limit: the oldest still sending its head made room
    "fd_limit",  # accept ran out of file descriptors: the same, to make room
    "head_too_large",  # a request head over the endpoint's HEAD_LIMIT
    "write_deadline",  # the client did not take the answer within the deadline
)


#: The manager's own families: (name, kind, help).
MANAGER_FAMILIES = (
    ("kvtier_lookups_total", "counter", "Manager lookups (calls)"),
    ("kvtier_stored_chunks_total", "counter", "Chunks the engine stored into host memory"),
    ("kvtier_store_failed_chunks_total", "counter", "Host stores the engine reported as failed"),
    ("kvtier_store_rejected_total", "counter", "prepare_store refused: no free slot"),
    ("kvtier_evicted_chunks_total", "counter", "Chunks evicted from host memory"),
    ("kvtier_lookup_host_full_total", "counter", "Lookups that could not promote: every slot held"),
    ("kvtier_transfer_bytes_total", "counter", "Accelerator <-> host bytes, by direction"),
    ("kvtier_transfer_seconds", "histogram", "Accelerator <-> host copy time"),
    ("kvtier_tier_lookups_total", "counter", "Tier lookups by answer (hit, miss, retry, error)"),
    ("kvtier_tier_chunks_total", "counter", "Chunks moved by tier jobs, by op and outcome"),
    ("kvtier_tier_bytes_total", "counter", "Bytes stored to or promoted from a tier"),
    ("kvtier_tier_job_seconds", "histogram", "Tier job latency; op=load is the promotion latency"),
    ("kvtier_tier_job_failures_total", "counter", "Tier jobs with at least one failed chunk"),
    ("kvtier_tier_integrity_failures_total", "counter", "Chunks a tier found but failed to verify"),
    ("kvtier_tier_errors_total", "counter", "Exceptions raised by a tier, by where"),
    ("kvtier_prompt_tokens_total", "counter", "Prompt tokens by where they came from"),
    ("kvtier_recomputed_chunks_total", "counter", "Chunks recomputed, by the reason of the miss"),
    ("kvtier_events_total", "counter", "KV events recorded, by kind"),
    ("kvtier_internal_errors_total", "counter", "Unexpected conditions survived, by kind"),
    ("kvtier_tier_disabled_total", "counter", "Tiers switched off at run time, by reason"),
    ("kvtier_tier_timeouts_total", "counter", "Tier jobs past their deadline, by op"),
    ("kvtier_admission_dropped_total", "counter", "Chunks a level did not admit, by reason"),
    ("kvtier_retention_ignored_total", "counter", "Requests whose retention could not act, by why"),
    ("kvtier_shm_regions_removed_total", "counter", "Host regions of dead vLLM engines removed"),
    ("kvtier_shm_bytes_removed_total", "counter", "Bytes of the host regions removed"),
)  # fmt: skip

#: Why a chunk was recomputed; each recomputed chunk is counted under exactly one.
MISS_REASONS = (
    "never_stored",  # no tier holds it and this instance never had it
    "evicted",  # this instance had it, evicted it from host, and no tier holds it
    "tier_unavailable",  # a tier that might hold it is down (raised, or circuit open)
    "integrity_failure",  # a tier held bytes that failed verification
    "promotion_failed",  # a tier held it but could not read it back
    "host_full",  # a tier holds it but every host slot is held, nowhere to promote
    "store_in_flight",  # the engine is still writing it into host memory
    "tier_disabled",  # the tier that might hold it is switched off (by hand or the SLO guard)
    "not_admitted",  # host refused it, or every secondary tier did and host evicted it
    "tier_timeout",  # the tier that holds it is past a deadline (a promotion or probe hangs)
)


class ManagerMetrics:
    """The manager's telemetry, in the words of what happened."""

    def __init__(self, telemetry: Telemetry | None = None) -> None:
        self.telemetry = telemetry or Telemetry()
        for name, kind, doc in MANAGER_FAMILIES:
            self.telemetry.declare(name, kind, doc)

    def count(self, name: str, amount: float = 1, **labels: str) -> None:
        self.telemetry.inc(f"kvtier_{name}_total", amount, **labels)

    def counter(self, name: str, **labels: str) -> Callable[[float], None]:
        """``count(name, amount, **labels)`` with the name and labels bound once: a hot path
        keeps it and calls it with the amount."""
        return functools.partial(self.telemetry.add, f"kvtier_{name}_total", labels_key(labels))

    def transfer(self, direction: str, nbytes: int, seconds: float) -> None:
        self.count("transfer_bytes", nbytes, direction=direction)
        self.telemetry.observe("kvtier_transfer_seconds", seconds, direction=direction)

    def job(self, tier: str, op: str, ok: int, failed: int, nbytes: int, seconds: float) -> None:
        self.count("tier_chunks", ok, tier=tier, op=op, outcome="ok")
        self.count("tier_chunks", failed, tier=tier, op=op, outcome="failed")
        self.count("tier_bytes", nbytes, tier=tier, op=op)
        self.telemetry.observe("kvtier_tier_job_seconds", seconds, tier=tier, op=op)
        if failed:
            self.count("tier_job_failures", tier=tier, op=op)

    def tier_for(self, tier: str) -> TierMetrics:
        return TierMetrics(self.telemetry, tier)

    def counters_of(self, tier: str) -> dict[str, int]:
        """Tier ``tier``'s series of every counter family, named ``family:label=value:...``
        without ``kvtier_``, ``_total`` and the tier label (``tier_chunks:op=load:outcome=ok``)."""
        out = {}
        families = self.telemetry.families
        for name, series in self.telemetry.snapshot().items():
            if families[name].kind != "counter":
                continue
            for labels, value in series.items():
                if ("tier", tier) in labels and value:
                    short = name.removeprefix("kvtier_").removesuffix("_total")
                    rest = [f":{k}={v}" for k, v in sorted(labels) if k != "tier"]
                    out[short + "".join(rest)] = int(value)
        return out

    def flat(self) -> dict[str, float]:
        """Every non-zero series as ``name{label=value,...}``, for ``stats()`` and logs."""
        out = {}
        for name, series in self.telemetry.snapshot().items():
            for labels, value in series.items():
                if value:
                    inner = ",".join(f"{k}={v}" for k, v in labels)
                    out[f"{name}{{{inner}}}" if inner else name] = value
        return out
