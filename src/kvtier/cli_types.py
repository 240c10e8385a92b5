"""argparse value types shared by every kvtier command: bounded integers and numbers.

A value out of range is an argparse error (the command's usage, ``kvtier: error: ...``, exit
status 2), never a traceback.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {low} to {high}, got {value}")
        return value

    return parse


def float_in(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number above ``low`` and at most ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and low < value <= high):
            raise argparse.ArgumentTypeError(
                f"expected above {low:g}, at most {high:g}, got {text}"
            )
        return value

    return parse
