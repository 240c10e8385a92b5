"""The built-in admission rules, and loading a policy of your own by ``module_path``."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from kvtier.admission import AdmissionConfig, AdmissionPolicy, Offer
from kvtier.admission.sketch import FrequencySketch
from kvtier.errors import ConfigError


class Rules:
    """``min_reuse``, ``min_frequency`` and ``min_prefix_chunks`` of one ``AdmissionConfig``."""

    def __init__(self, config: AdmissionConfig, frequency: FrequencySketch | None) -> None:
        self._config, self._frequency = config, frequency

    def admit(self, offer: Offer) -> Sequence[str | None]:
        config = self._config
        recent = self._frequency.estimate(offer.keys) if self._frequency is not None else None
        reasons: list[str | None] = []
        for index, seen in enumerate(offer.seen):
            if offer.prefix_chunks[index] < config.min_prefix_chunks:
                reasons.append("min_prefix_chunks")
            elif seen < config.min_reuse:
                reasons.append("min_reuse")
            elif recent is not None and recent[index] < config.min_frequency:
                reasons.append("min_frequency")
            else:
                reasons.append(None)
        return reasons


def load_policy(config: AdmissionConfig) -> AdmissionPolicy:
    """The class ``config.type`` of module ``config.module_path``, built with its options."""
    where = f"admission[{config.level}]"
    assert config.module_path is not None and config.type is not None
    try:
        cls = getattr(importlib.import_module(config.module_path), config.type)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{where}.module_path: cannot load {config.type}: {exc}") from exc
    try:
        policy = cls(**config.options)
    except Exception as exc:
        raise ConfigError(f"{where}.options: {config.type} refused them: {exc}") from exc
    if not callable(getattr(policy, "admit", None)):
        raise ConfigError(f"{where}.type: {config.type} has no admit(offer) method")
    return policy  # type: ignore[no-any-return]
