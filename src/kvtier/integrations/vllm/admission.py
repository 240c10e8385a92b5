"""kvtier's admission for one vLLM secondary tier: which stored chunks the tier is written.

Under vLLM, host memory is vLLM's and a chunk is offered to each secondary tier once, when vLLM
stores it into host memory (vLLM refuses its own ``store_threshold`` with tiering). A tier entry
may take ``admission``, one kvtier admission entry without ``level``::

    {"type": "KvtierFs", ..., "admission": {"min_reuse": 2, "min_prefix_chunks": 4}}

``min_reuse``, ``min_frequency`` / ``frequency_window``, ``min_prefix_chunks`` and
``module_path`` policies mean what they mean in kvtier's manager (``kvtier.admission``), with the
sightings of a chunk being the stores of it offered to this tier: a chunk recomputed and stored
again after it left host memory is offered again. A prefix's length is that of the storing
request up to the offered chunks (vLLM records each chunk's end token). Together with
``secondary_min_priority`` the reasons a chunk is dropped are counted per reason.

Thread safety: none needed; vLLM calls its secondary tiers on the scheduler thread. Nothing here
imports vLLM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from kvtier.admission import AdmissionConfig, AdmissionPolicy, Offer
from kvtier.admission.policies import Rules, load_policy, verdicts
from kvtier.admission.sketch import FrequencySketch
from kvtier.errors import ConfigError
from kvtier.keys import ChunkKey

_FIELDS = {f.name for f in dataclasses.fields(AdmissionConfig)} - {"level"}


def admission_config(entry: Any, path: str) -> AdmissionConfig | None:
    """The tier's ``admission`` entry (``None`` if absent); ``ConfigError`` naming a bad key."""
    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        raise ConfigError(f'{path}.admission: expected an object such as {{"min_reuse": 2}}')
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise ConfigError(f"{path}.admission.{unknown[0]}: unknown key")
    try:
        return AdmissionConfig(level=path, **entry)
    except ConfigError as exc:
        raise ConfigError(f"{path}.admission.{exc}") from None


class TierAdmission:
    """The chunks one tier keeps of those offered: ``reasons`` gives ``None`` or why not."""

    def __init__(self, config: AdmissionConfig | None, min_priority: int = 0) -> None:
        self._min_priority = min_priority
        self._sightings = FrequencySketch() if config is not None else None
        self._recent: FrequencySketch | None = None
        self._policy: AdmissionPolicy | None = None
        if config is not None and config.module_path is not None:
            self._policy = load_policy(config)
        elif config is not None:
            if config.min_frequency > 1:
                self._recent = FrequencySketch(decay_every=config.frequency_window)
            self._policy = Rules(config, self._recent)
        self.active = config is not None or min_priority > 0

    def reasons(
        self, keys: Sequence[ChunkKey], priorities: Sequence[int], prefix_chunks: Sequence[int]
    ) -> list[str | None]:
        """Per offered key: ``None`` to write it, or the reason it is dropped."""
        reasons: list[str | None] = [
            "priority" if p < self._min_priority else None for p in priorities
        ]
        if self._policy is None or self._sightings is None:
            return reasons
        for sketch in (self._sightings, self._recent):
            if sketch is not None:
                sketch.record(keys)
        offer = Offer(keys, self._sightings.estimate(keys).tolist(), prefix_chunks, priorities)
        answer = verdicts(self._policy, offer)
        return [old or new for old, new in zip(reasons, answer, strict=True)]
