"""Whether O_DIRECT can move a region's host rows in place, and what ``o_direct`` becomes.

O_DIRECT reads and writes the host slot itself (no bounce buffer), so every row must start on
an ``ALIGNMENT`` (4096-byte) boundary and rows must be a multiple of it apart. kvtier's own
``HostRegion`` always is; vLLM's rows (``PrimaryRegion``, its ``direct_io_capable``) may not be.
Over such rows ``"auto"`` means the page cache, and ``"on"`` is a ``ConfigError`` at start:
otherwise the tier would start and then fail every store with EINVAL.

Thread safety: plain functions, run once at start.
"""

from __future__ import annotations

import numpy as np

from kvtier.errors import ConfigError
from kvtier.region import ALIGNMENT, HostRegion


def row_misalignment(region: HostRegion) -> str | None:
    """Why ``region``'s rows cannot take O_DIRECT, or ``None`` when they can."""
    if region.stride % ALIGNMENT:
        return f"its rows are {region.stride} bytes apart, not a multiple of {ALIGNMENT}"
    start = np.frombuffer(region.aligned_view(0), dtype=np.uint8).ctypes.data
    if start % ALIGNMENT:
        return f"its rows start {start % ALIGNMENT} bytes past a {ALIGNMENT}-byte boundary"
    return None


def o_direct_for(o_direct: str, region: HostRegion) -> str:
    """``o_direct`` ("auto", "on", "off") as it can be over ``region``: "auto" becomes "off"
    over rows O_DIRECT cannot move; "on" there raises ``ConfigError`` naming the key and why."""
    if o_direct == "off":
        return o_direct
    problem = row_misalignment(region)
    if problem is None:
        return o_direct
    if o_direct == "auto":
        return "off"
    raise ConfigError(
        f'o_direct: "on" needs host rows aligned to {ALIGNMENT} bytes (O_DIRECT moves them in '
        f'place), but {problem}; set o_direct to "auto" (the page cache here) or "off"'
    )
