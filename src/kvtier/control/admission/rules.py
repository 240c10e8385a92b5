"""The built-in admission rules, loading a policy of your own by ``module_path``, and asking a
policy for its verdicts (``verdicts``)."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence

from kvtier.control.admission import AdmissionConfig, AdmissionPolicy, Offer
from kvtier.control.admission.sketch import FrequencySketch
from kvtier.errors import ConfigError
from kvtier.telemetry.logs import ThrottledLog

POLICY_ERROR = "policy_error"
_log = ThrottledLog(logging.getLogger(__name__))


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
    """The class ``config.type`` of module ``config.module_path``, built with its options;
    ``ConfigError`` for whatever goes wrong (a module that fails as it is imported included)."""
    where = f"admission[{config.level}]"
    assert config.module_path is not None and config.type is not None
    try:  # a relative name raises TypeError, a broken module anything at all
        cls = getattr(importlib.import_module(config.module_path), config.type)
    except Exception as exc:
        raise ConfigError(f"{where}.module_path: cannot load {config.type}: {exc!r}") from exc
    try:
        policy = cls(**config.options)
    except Exception as exc:
        raise ConfigError(f"{where}.options: {config.type} refused them: {exc}") from exc
    if not callable(getattr(policy, "admit", None)):
        raise ConfigError(f"{where}.type: {config.type} has no admit(offer) method")
    return policy  # type: ignore[no-any-return]


def verdicts(policy: AdmissionPolicy, offer: Offer) -> Sequence[str | None]:
    """``policy``'s verdicts on ``offer``: one per key, ``None`` or a non-empty reason; all
    ``POLICY_ERROR`` (logged) when it raises or answers anything else, so a broken policy of a
    user's own costs recomputes, never a failed engine call."""
    name = type(policy).__name__
    try:
        answer = list(policy.admit(offer))
    except Exception as exc:
        _log.warning(
            f"raised:{name}", "admission policy %s raised %r: its offer is dropped", name, exc
        )
        return [POLICY_ERROR] * len(offer.keys)
    if len(answer) != len(offer.keys) or not all(
        v is None or (isinstance(v, str) and v) for v in answer
    ):
        _log.warning(
            f"answer:{name}",
            "admission policy %s answered %d verdicts (None or a "
            "reason each) for %d chunks: its offer is dropped",
            name,
            len(answer),
            len(offer.keys),
        )
        return [POLICY_ERROR] * len(offer.keys)
    return answer
