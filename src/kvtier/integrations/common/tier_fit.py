"""A tier's configuration fitted to host memory that kvtier does not own.

Over an engine's host rows (vLLM's primary view, SGLang's host pool) kvtier cannot choose the
alignment, so O_DIRECT, which moves the rows in place, may be impossible: ``"auto"`` then means
the page cache. Nothing here imports an engine.
"""

from __future__ import annotations

import dataclasses

from kvtier.tiers.base import TierConfig
from kvtier.tiers.fs.config import FsTierConfig


def fit_to_rows(config: TierConfig, direct_io_capable: bool) -> TierConfig:
    """``config``, with an fs tier's ``o_direct: "auto"`` turned off over rows O_DIRECT cannot
    move (``direct_io_capable`` false); every other config unchanged."""
    if isinstance(config, FsTierConfig) and config.o_direct == "auto" and not direct_io_capable:
        return dataclasses.replace(config, o_direct="off")
    return config
