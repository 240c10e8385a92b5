"""What a ``TieringManager`` is made of, built in dependency order by ``build_parts``.

Host region, host slots, the secondary tiers and the ``Runtime`` over them, then what reads
them: provenance, the event log, the slot allocator, retention, the promoter, the progress
signal, and the KV-event publisher. Nothing here starts a thread that calls back into the
manager (the operator endpoint, a peer server): the manager starts those once it holds the
parts. A failure closes what was built so far and raises.

Runs once, on the thread that builds the manager.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.config.checks import key_path, listen_errors
from kvtier.config.schema import KVEventsConfig, TieringConfig
from kvtier.control.retention import HostRetention
from kvtier.core.deadlines import WRITE_THROUGH_SHARE
from kvtier.core.host_slots import HostTier
from kvtier.core.peer_service import close_all
from kvtier.core.progress import Progress
from kvtier.core.promotion import Promoter
from kvtier.core.provenance import Provenance
from kvtier.core.runtime import Runtime
from kvtier.core.slot_allocator import SlotAllocator
from kvtier.core.write_through import WriteThroughs
from kvtier.errors import ConfigError
from kvtier.identity import CacheIdentity
from kvtier.region import HostRegion
from kvtier.telemetry.kv_events import EventKind, EventLog, EventPublisher
from kvtier.telemetry.metrics import ManagerMetrics
from kvtier.telemetry.transfer_meter import TransferMeter
from kvtier.tiers.base import SecondaryTier
from kvtier.tiers.registry import build_tier

log = logging.getLogger(__name__)

#: Builds a tier over the manager's host region, for ``TieringManager(tiers=...)``.
TierFactory = Callable[[HostRegion, CacheIdentity], SecondaryTier]


@dataclass(frozen=True)
class ManagerParts:
    """Everything a manager composes; ``runtime`` owns the tiers."""

    region: HostRegion
    host: HostTier
    runtime: Runtime
    provenance: Provenance
    events: EventLog
    slots: SlotAllocator
    retention: HostRetention
    promoter: Promoter
    progress: Progress
    clock: TransferMeter
    publisher: EventPublisher | None
    write_throughs: WriteThroughs


def build_parts(
    config: TieringConfig,
    identity: CacheIdentity,
    tiers: Sequence[SecondaryTier | TierFactory] | None,
    region: HostRegion | None,
) -> ManagerParts:
    """The parts of a manager (``TieringManager`` documents ``tiers`` and ``region``)."""
    try:
        check_arguments(config, identity, tiers)
    except ConfigError:  # the manager owns the tiers it is given, even when it cannot start
        close_all([t for t in tiers or () if isinstance(t, SecondaryTier)])
        raise
    try:
        config.check_layout(identity.layout)
    except ConfigError as exc:  # the identity's layout decides the keys, so it wins
        log.warning("%s; chunks follow the cache identity's layout", exc)
    chunk_bytes = identity.layout.chunk_bytes
    region = region or HostRegion(config.host_slots(chunk_bytes), chunk_bytes)
    if region.slot_bytes < chunk_bytes:
        raise ConfigError(f"region: slots of {region.slot_bytes} bytes < one chunk")
    host = HostTier(region.num_slots, config.eviction_policy)
    built = build_tiers(config, identity, region, tiers)
    runtime = Runtime(config.runtime_config(), chunk_bytes, built)
    try:
        publisher = _publisher(config.kv_events)
    except BaseException:
        runtime.close()
        raise
    metrics = runtime.metrics
    provenance = Provenance(metrics, runtime.tiers, identity.layout.tokens_per_chunk)
    count = functools.partial(_count_events, metrics)
    events = EventLog(outbox=publisher is not None, on_add=count)  # no publisher: none read it
    slots = SlotAllocator(host, provenance, metrics, events)
    promoter = Promoter(host, runtime.tiers, slots, provenance, metrics, events)
    retention = HostRetention(host, runtime.admission, provenance)
    clock = TransferMeter(metrics, chunk_bytes)
    cap = max(1, int(region.num_slots * WRITE_THROUGH_SHARE))
    write_throughs = WriteThroughs(host, runtime.tiers, metrics, events, cap)
    return ManagerParts(
        region, host, runtime, provenance, events, slots, retention, promoter, Progress(built),
        clock, publisher, write_throughs,
    )  # fmt: skip


def check_arguments(config: object, identity: object, tiers: object) -> None:
    """``ConfigError`` for a manager's argument of the wrong type (a dict for the config), at
    the call rather than as an ``AttributeError`` from the part that first reads it."""
    if not isinstance(config, TieringConfig):
        raise ConfigError(
            f"config: expected a TieringConfig (TieringConfig.load, from_json or from_dict), "
            f"got {type(config).__name__}"
        )
    if not isinstance(identity, CacheIdentity):
        raise ConfigError(f"identity: expected a CacheIdentity, got {type(identity).__name__}")
    if tiers is None:
        return
    if not isinstance(tiers, list | tuple):
        raise ConfigError(f"tiers: expected a list, got {type(tiers).__name__}")
    for index, tier in enumerate(tiers):
        if not (isinstance(tier, SecondaryTier) or callable(tier)):
            raise ConfigError(
                f"tiers[{index}]: expected a SecondaryTier or a factory (region, identity) -> "
                f"SecondaryTier, got {type(tier).__name__}"
            )


def build_tiers(
    config: TieringConfig,
    identity: CacheIdentity,
    region: HostRegion,
    given: Sequence[SecondaryTier | TierFactory] | None,
) -> list[SecondaryTier]:
    """``given`` (tiers or factories), else the tiers of ``config.secondary_tiers``; if one
    cannot be built, those built before it are closed."""
    built: list[SecondaryTier] = []
    try:
        for index, tier in enumerate(config.secondary_tiers if given is None else given):
            if isinstance(tier, SecondaryTier):
                built.append(tier)
            elif callable(tier):
                built.append(tier(region, identity))
            else:
                with key_path(f"secondary_tiers[{index}]"):
                    built.append(build_tier(tier, region, identity))
    except BaseException:
        close_all(built)
        raise
    return built


def _publisher(events: KVEventsConfig | None) -> EventPublisher | None:
    if events is None or not events.enable_kv_cache_events:
        return None
    with listen_errors("kv_events.endpoint", events.endpoint):
        return EventPublisher(events.endpoint, events.topic or "", events.hwm)


def _count_events(metrics: ManagerMetrics, kind: EventKind, num_events: int) -> None:
    metrics.count("events", num_events, kind=kind.value)
