"""Admission: which chunks each level keeps (host memory, and each secondary tier).

"Choose admission before capacity": a chunk with little chance of reuse should be dropped
outright rather than push out one that will be reused. Each level (``host`` or a tier's name)
can have an ``AdmissionConfig``:

* ``min_reuse``: keep a chunk only once it was seen (offered by ``prepare_store``, loaded, or
  hit in the accelerator) at least this many times; vLLM's ``store_threshold`` is its alias for
  host memory;
* ``min_frequency`` / ``frequency_window``: TinyLFU-style, keep a chunk only if its recent
  frequency (counts halved every ``frequency_window`` sightings) reaches ``min_frequency``;
* ``min_prefix_chunks``: keep no chunk of a prefix shorter than this;
* ``module_path`` + ``type`` (+ ``options``): a policy of your own (``AdmissionPolicy``).

Counts live in count-min sketches (``sketch``) of fixed size, whatever the number of keys. A
dropped chunk is counted in ``kvtier_admission_dropped_total{tier,reason}``; one kept nowhere is
recomputed next time, its miss counted as ``not_admitted``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from kvtier.config.checks import Bounds, PythonName, check_fields
from kvtier.errors import ConfigError
from kvtier.keys import ChunkKey

MAX_COUNT = 255  # sketch counters saturate here
MAX_CHUNKS = 1 << 40


@dataclass(frozen=True)
class AdmissionConfig:
    """One level's admission: ``level`` is ``host`` or a secondary tier's name."""

    level: str = "host"
    min_reuse: int = 1
    min_frequency: int = 1
    frequency_window: int = 100_000
    min_prefix_chunks: Annotated[int, Bounds(0, MAX_CHUNKS, "an integer from 0 to 2**40")] = 0
    module_path: Annotated[str, PythonName(dotted=True)] | None = None
    type: Annotated[str, PythonName()] | None = None
    options: Any = field(default_factory=dict)  # keyword arguments of the policy's class

    def __post_init__(self) -> None:
        check_fields(self)  # the marks, for a config built by hand (the parser applied them)
        for name in ("min_reuse", "min_frequency"):
            _check_int(name, getattr(self, name), 1, MAX_COUNT)
        _check_int("frequency_window", self.frequency_window, 1, MAX_CHUNKS)
        _check_int("min_prefix_chunks", self.min_prefix_chunks, 0, MAX_CHUNKS)
        if (self.module_path is None) != (self.type is None):
            raise ConfigError("module_path, type: a policy of your own needs both")
        if not isinstance(self.options, Mapping) or not all(
            isinstance(k, str) for k in self.options
        ):
            raise ConfigError("options: expected a JSON object of the policy's keyword arguments")


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    if not ok or (isinstance(value, float) and not math.isfinite(value)):
        raise ConfigError(f"{name}: expected an integer from {low} to {high}, got {value!r}")


@dataclass(frozen=True)
class Offer:
    """What a level is offered: chunks of one request, with what is known about them."""

    keys: Sequence[ChunkKey]
    seen: Sequence[int]  # estimated sightings of each key (min_reuse's counts)
    prefix_chunks: Sequence[int]  # per key: chunks of its request's prefix that were stored
    priorities: Sequence[int]  # retention priority of each key (0-100)


class AdmissionPolicy(Protocol):
    """A policy of your own: ``cls(**options)``, called under the manager's lock; no I/O."""

    def admit(self, offer: Offer) -> Sequence[str | None]:
        """Per key: ``None`` to keep it, or a short reason (a counter label) to drop it."""
        ...
