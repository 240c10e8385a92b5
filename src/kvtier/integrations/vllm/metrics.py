"""kvtier's tier counters as vLLM offloading metrics (``vllm:kv_offload_tiering_kvtier_*``).

vLLM declares every Prometheus metric up front from ``build_metric_definitions`` and then sums
the per-step increments each tier returns from ``get_stats``. kvtier tiers count what they do in
``tier.stats()`` (cumulative, tier-specific names) and the adapter counts jobs and integrity
failures; both become one counter family, labeled by vLLM's tier label (``"1:KvtierFs"``) and
the counter's name::

    vllm:kv_offload_tiering_kvtier_counter_total{tier="1:KvtierFs",counter="loaded_chunks"}

``CounterBridge`` turns cumulative snapshots into those increments. It imports vLLM only when
``definitions`` or ``take_stats`` is called. Thread safety: scheduler thread only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COUNTER = "vllm:kv_offload_tiering_kvtier_counter"
LABELS = ("tier", "counter")


def definitions() -> dict[str, Any]:
    """The metric definitions every kvtier tier adds to vLLM's (one labeled counter family)."""
    from vllm.v1.kv_offload.base import OffloadingCounterMetadata

    doc = "Counters of kvtier secondary tiers (chunks, bytes, failures by reason), by name."
    return {COUNTER: OffloadingCounterMetadata(documentation=doc, labelnames=LABELS)}


def tier_label(entries: Any, tier_type: str, options: Mapping[str, Any]) -> str:
    """vLLM's label of this tier, ``"<position + 1>:<type>"``, found among the spec's entries."""
    skip = {"type", "module_path", "backpressure"}
    for position, entry in enumerate(entries if isinstance(entries, list) else []):
        rest = {k: v for k, v in entry.items() if k not in skip}
        if entry.get("type") == tier_type and rest == dict(options):
            return f"{position + 1}:{tier_type}"
    return tier_type


class CounterBridge:
    """Increments since the last ``take_stats`` of cumulative counters, as vLLM stats."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._reported: dict[str, int] = {}

    def increments(self, counters: Mapping[str, int]) -> dict[str, int]:
        changed = {}
        for name, value in counters.items():
            delta = int(value) - self._reported.get(name, 0)
            if delta > 0:
                changed[name] = delta
                self._reported[name] = int(value)
        return changed

    def take_stats(self, counters: Mapping[str, int]) -> Any:
        """An ``OffloadingConnectorStats`` of what grew, or None when nothing did."""
        changed = self.increments(counters)
        if not changed:
            return None
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        stats = OffloadingConnectorStats()
        for name, delta in sorted(changed.items()):
            stats.increase_counter(COUNTER, delta, (self.label, name))
        return stats
