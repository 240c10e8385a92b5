"""kvtier's configuration: ``TieringConfig`` and one frozen dataclass per tier type.

``schema`` defines them, ``parser`` reads JSON into them, ``checks`` holds the value checks
they share. Everything a user imports is re-exported here.
"""

from kvtier.config.schema import (
    RUNTIME_KEYS,
    TIER_CONFIGS,
    ExternalTierConfig,
    FaultTierConfig,
    FsTierConfig,
    GiB,
    KVEventsConfig,
    MemoryTierConfig,
    ObjTierConfig,
    P2PTierConfig,
    PeerAddress,
    RuntimeConfig,
    ServeConfig,
    TierConfig,
    TieringConfig,
)
from kvtier.control.admission import AdmissionConfig
from kvtier.control.slo_guard import SLOGuardConfig

__all__ = [
    "RUNTIME_KEYS",
    "TIER_CONFIGS",
    "AdmissionConfig",
    "ExternalTierConfig",
    "FaultTierConfig",
    "FsTierConfig",
    "GiB",
    "KVEventsConfig",
    "MemoryTierConfig",
    "ObjTierConfig",
    "P2PTierConfig",
    "PeerAddress",
    "RuntimeConfig",
    "SLOGuardConfig",
    "ServeConfig",
    "TierConfig",
    "TieringConfig",
]
