"""Admission: the decisions for host memory and each secondary tier, and what they count.

``seen`` records a sighting of chunks (offered, loaded, hit); ``admit`` splits a level's offer
into the chunks it keeps and those it drops, counting the dropped ones by reason. For secondary
tiers it also applies ``secondary_min_priority`` (one for every tier, or one per tier in
``min_priority_of``): chunks retained below it never reach that tier (reason ``priority``). A
broken policy drops its offers (``policies.verdicts``). With nothing configured, every method
returns at once.

Thread safety: none; its runtime's engine path calls it under the runtime's lock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvtier.control.admission import AdmissionConfig, AdmissionPolicy, Offer
from kvtier.control.admission.rules import Rules, load_policy, verdicts
from kvtier.control.admission.sketch import FrequencySketch
from kvtier.errors import ConfigError
from kvtier.keys import ChunkKey
from kvtier.telemetry.metrics import ManagerMetrics

HOST = "host"


class Admission:
    """Per level (``host`` or a tier name): the policies that decide what it keeps.

    ``ConfigError`` for a level that names no tier, and for a tier named ``host`` while
    anything is configured (host memory's level would be taken for it).
    """

    def __init__(
        self,
        configs: Sequence[AdmissionConfig],
        levels: Sequence[str],
        metrics: ManagerMetrics,
        secondary_min_priority: int = 0,
        min_priority_of: Mapping[str, int] | None = None,
    ) -> None:
        self._metrics, self._min_priority = metrics, secondary_min_priority
        self._min_priority_of = dict(min_priority_of or {})
        self._reuse = FrequencySketch() if configs else None
        self._windows: dict[int, FrequencySketch] = {}
        self._policies: dict[str, list[AdmissionPolicy]] = {}
        for index, config in enumerate(configs):
            if config.level not in (HOST, *levels):
                known = ", ".join((HOST, *levels))
                raise ConfigError(f"admission[{index}].level: expected one of {known}")
            self._policies.setdefault(config.level, []).extend(self._policies_of(config))
        self._prefix: dict[ChunkKey, int] = {}  # keys being stored -> their prefix's chunks
        floors = (secondary_min_priority, *self._min_priority_of.values())
        self.active = bool(configs) or max(floors) > 0
        if self.active and HOST in levels:  # its level would be host memory's
            raise ConfigError(
                "secondary_tiers: a tier named 'host' needs another name when "
                "admission or secondary_min_priority is set"
            )

    def _policies_of(self, config: AdmissionConfig) -> list[AdmissionPolicy]:
        """The entry's built-in rules, then its policy of your own (if any): a chunk must pass
        both, so rules given beside a ``module_path`` are never silently ignored."""
        frequency = None
        if config.min_frequency > 1:
            window = config.frequency_window
            frequency = self._windows.setdefault(window, FrequencySketch(decay_every=window))
        rules: list[AdmissionPolicy] = [Rules(config, frequency)]
        return rules if config.module_path is None else [*rules, load_policy(config)]

    def seen(self, keys: Sequence[ChunkKey]) -> None:
        """One sighting of each key (offered by the engine, loaded, or hit)."""
        if self._reuse is not None:
            self._reuse.record(keys)
            for sketch in self._windows.values():
                sketch.record(keys)

    def offer(self, keys: list[ChunkKey], prefix_chunks: int, priorities: Sequence[int]) -> Offer:
        """An offer of new chunks of a prefix ``prefix_chunks`` long (its chunks in host too)."""
        prefix = [prefix_chunks] * len(keys)
        seen = self._reuse.estimate(keys).tolist() if self._reuse is not None else [0] * len(keys)
        return Offer(keys, seen, prefix, priorities)

    def admit(self, level: str, offer: Offer) -> list[ChunkKey]:
        """The keys of ``offer`` that ``level`` keeps; the others are counted as dropped."""
        if not self.active:
            return list(offer.keys)
        floor = 0 if level == HOST else self._min_priority_of.get(level, self._min_priority)
        reasons: list[str | None] = ["priority" if p < floor else None for p in offer.priorities]
        for policy in self._policies.get(level, ()):
            answer = verdicts(policy, offer)
            reasons = [old or new for old, new in zip(reasons, answer, strict=True)]
        for reason in filter(None, set(reasons)):
            self._metrics.count(
                "admission_dropped", reasons.count(reason), tier=level, reason=reason
            )
        return [key for key, reason in zip(offer.keys, reasons, strict=True) if reason is None]

    # -- between prepare_store and complete_store ------------------------------------------
    def remember(self, offer: Offer, kept: Sequence[ChunkKey]) -> None:
        if self.active:
            prefix = dict(zip(offer.keys, offer.prefix_chunks, strict=True))
            self._prefix.update((key, prefix[key]) for key in kept)

    def stored(self, keys: list[ChunkKey], priorities: Sequence[int]) -> Offer:
        """The offer of freshly stored ``keys`` to the secondary tiers."""
        prefix = [self._prefix.pop(key, len(keys)) for key in keys] if self._prefix else []
        seen = self._reuse.estimate(keys).tolist() if self._reuse is not None else [0] * len(keys)
        return Offer(keys, seen, prefix or [len(keys)] * len(keys), priorities)

    def forget(self, keys: Sequence[ChunkKey]) -> None:
        """Keys whose store failed."""
        for key in keys:
            self._prefix.pop(key, None)
