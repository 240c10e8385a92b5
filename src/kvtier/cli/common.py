"""What every kvtier command shares: its error type, argparse value types and help layout.

A value out of range is an argparse error (the command's usage, ``kvtier: error: ...``, exit
status 2), never a traceback. A handler reports bad input by raising ``UsageError``; ``kvtier``'s
``main`` prints it the same way.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any


class UsageError(Exception):
    """Bad input to a command: printed as the command's usage, ``kvtier: error: MESSAGE``, and
    exit status 2."""


class CliFormatter(argparse.HelpFormatter):
    """argparse's layout, with ``(default: X)`` added to every option that has a default and
    whose help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default in ("", argparse.SUPPRESS)
        if unset or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def one_line(text: str) -> str:
    """``text`` with control characters (a newline in a path, a server's answer) escaped: one
    line, and nothing from input can drive the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


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


def float_in(low: float, high: float, *, low_ok: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number above ``low`` (or equal to it with ``low_ok``) and at
    most ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        above = value >= low if low_ok else value > low
        if not (math.isfinite(value) and above and value <= high):
            floor = "at least" if low_ok else "above"
            raise argparse.ArgumentTypeError(
                f"expected {floor} {low:g}, at most {high:g}, got {text}"
            )
        return value

    return parse


def add_model_shape(group: Any) -> None:
    """``--num-layers``, ``--num-kv-heads``, ``--head-dim`` and ``--dtype`` on ``group``: a
    model's KV shape, Llama-3-8B in bfloat16 by default (``config check`` and ``plan``)."""
    from kvtier.layout import DTYPE_SIZES

    size = int_in(1, 1 << 16)
    group.add_argument(
        "--num-layers",
        type=size,
        default=32,
        metavar="N",
        help="layers with a KV cache, 1 to 65536",
    )
    heads = "KV heads per layer (after grouped-query sharing), 1 to 65536"
    group.add_argument("--num-kv-heads", type=size, default=8, metavar="N", help=heads)
    group.add_argument(
        "--head-dim", type=size, default=128, metavar="N", help="elements per KV head, 1 to 65536"
    )
    group.add_argument(
        "--dtype",
        default="bfloat16",
        choices=sorted(DTYPE_SIZES),
        help="element type of the KV cache",
    )
