"""kvtier: hierarchical KV-cache offloading for LLM serving.

Freed KV chunks go from the accelerator to host memory, and from there to secondary tiers (a
filesystem, an S3-compatible object store, peer instances); a later request with the same prefix
gets them back instead of recomputing them. See ``TieringManager`` for the engine-facing API.
"""

from kvtier import _moved
from kvtier.config import TieringConfig
from kvtier.core.manager import StorePlan, TieringManager
from kvtier.errors import (
    CapacityError,
    ConfigError,
    IntegrityError,
    KVTierError,
    TierError,
    TierUnavailable,
)
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey, chunk_keys
from kvtier.layout import KVLayout
from kvtier.tiers.base import HIT, MISS, RETRY, Lookup

__version__ = "0.1.0"

_moved.install()

__all__ = [
    "HIT",
    "MISS",
    "RETRY",
    "CacheIdentity",
    "CapacityError",
    "ChunkKey",
    "ConfigError",
    "IntegrityError",
    "KVLayout",
    "KVTierError",
    "Lookup",
    "StorePlan",
    "TierError",
    "TierUnavailable",
    "TieringConfig",
    "TieringManager",
    "chunk_keys",
]
