"""A tier defined outside the kvtier package, loaded by ``module_path`` in the tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from kvtier.config import MemoryTierConfig
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.memory import MemoryTier


@dataclass(frozen=True)
class PrefixedOptions:
    label: str
    capacity_bytes: int = 1 << 20


class PrefixedMemoryTier(MemoryTier):
    """A memory tier whose options are validated through ``config_class``."""

    config_class = PrefixedOptions

    def __init__(
        self, options: PrefixedOptions, region: HostRegion, identity: CacheIdentity
    ) -> None:
        super().__init__(MemoryTierConfig(capacity_bytes=options.capacity_bytes), region, identity)
        self.label = options.label


class UntypedTier(MemoryTier):
    """Takes its options as a plain mapping."""

    def __init__(self, options: Any, region: HostRegion, identity: CacheIdentity) -> None:
        super().__init__(MemoryTierConfig(), region, identity)
        self.options = dict(options)


class NotATier:
    pass


class BrokenTier(MemoryTier):
    def __init__(self, options: Any, region: HostRegion, identity: CacheIdentity) -> None:
        raise RuntimeError("cannot start")


class MeteredTier(MemoryTier):
    """Registers metrics of its own through the handle the manager binds."""

    def __init__(self, options: Any, region: HostRegion, identity: CacheIdentity) -> None:
        super().__init__(MemoryTierConfig(), region, identity)

    def lookup(self, key: Any) -> Any:
        self.metrics.counter("probes", "Lookups this tier answered").inc(kind="lookup")
        self.metrics.histogram("probe_seconds", "Probe time").observe(0.003)
        self.metrics.gauge("depth", "Queue depth").set(7)
        return super().lookup(key)

    def stats(self) -> dict[str, int]:
        return {"circuit_state": 1}


class KeywordTier(MemoryTier):
    """Takes the region by name and its options as keywords: not the tier constructor."""

    def __init__(
        self, region: HostRegion, *, capacity_bytes: int = 1 << 20, label: str = ""
    ) -> None:
        super().__init__(MemoryTierConfig(capacity_bytes=capacity_bytes), region, None)  # type: ignore[arg-type]
        self.label = label


#: Labels of the ``ClosingTier``s closed so far, in order.
CLOSED: list[str] = []


class ClosingTier(MemoryTier):
    """Records its ``close`` in ``CLOSED`` (a memory tier has no thread whose end shows it)."""

    def __init__(self, options: Any, region: HostRegion, identity: CacheIdentity) -> None:
        super().__init__(MemoryTierConfig(), region, identity)
        self.label = options.get("label", "")

    def close(self) -> None:
        CLOSED.append(self.label)
        super().close()


class GatedTier(MemoryTier):
    """A memory tier whose stores copy the slot only once ``gate`` is set: a tier still writing.

    ``started`` is set when a store is waiting at the gate. ``close`` opens the gate.
    """

    def __init__(self, options: Any, region: HostRegion, identity: CacheIdentity) -> None:
        super().__init__(MemoryTierConfig(), region, identity)
        self.label = options.get("label", "")
        self.gate, self.started = threading.Event(), threading.Event()

    def _store(self, job: TransferJob) -> list[ChunkKey]:
        self.started.set()
        if not self.gate.wait(timeout=60):
            raise TimeoutError("GatedTier: the gate stayed shut for 60 s")
        return super()._store(job)

    def close(self) -> None:
        self.gate.set()
        super().close()
