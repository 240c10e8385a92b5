"""Secondary tiers: the contract (``base``), the on-media format (``codec``) and the tiers."""

from kvtier.tiers.base import (
    HIT,
    MISS,
    RETRY,
    JobResult,
    Lookup,
    SecondaryTier,
    TransferJob,
)

__all__ = ["HIT", "MISS", "RETRY", "JobResult", "Lookup", "SecondaryTier", "TransferJob"]
