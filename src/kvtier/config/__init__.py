"""kvtier's configuration: ``TieringConfig`` and one frozen dataclass per tier type.

``schema`` defines them, ``parser`` reads JSON into them, ``checks`` holds the value checks
they share. Everything a user imports is re-exported here.
"""

from kvtier.config.checks import GiB
from kvtier.config.schema import (
    RUNTIME_KEYS,
    TIER_CONFIGS,
    KVEventsConfig,
    RuntimeConfig,
    TieringConfig,
)
from kvtier.control.admission import AdmissionConfig
from kvtier.control.slo_guard import SLOGuardConfig
from kvtier.tiers.base import TierConfig
from kvtier.tiers.catalog import ExternalTierConfig
from kvtier.tiers.fault import FaultTierConfig
from kvtier.tiers.fs.config import FsTierConfig
from kvtier.tiers.memory import MemoryTierConfig
from kvtier.tiers.peer.config import P2PTierConfig, PeerAddress, ServeConfig
from kvtier.tiers.s3.config import ObjTierConfig

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
