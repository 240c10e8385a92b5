"""Parsing ``--older-than`` durations (``7d``, ``12h``, ``30m``, ``90s``, ``2w``) and
``--max-bytes`` sizes (``500G``, ``1.5T``, ``1048576``; suffixes are powers of 1024).

Thread safety: plain functions.
"""

from __future__ import annotations

import math
import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_SIZES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """Seconds in ``text``; ``ValueError`` naming the expected form."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"expected a duration such as 7d, 12h, 30m or 90s, got {text!r}")
    seconds = float(match[1]) * _UNITS[match[2]]
    if not math.isfinite(seconds):  # digits past a float's range: no age is that old
        raise ValueError(f"expected a finite duration, got {text!r}")
    return seconds


def parse_bytes(text: str) -> int:
    """Bytes in ``text`` (at least 0); ``ValueError`` naming the expected form."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"expected a size such as 500G, 1.5T or 1048576, got {text!r}")
    value = float(match[1]) * _SIZES[match[2].lower()]
    if not math.isfinite(value):
        raise ValueError(f"expected a finite size, got {text!r}")
    return int(value)
