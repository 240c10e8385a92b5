"""Argument types and the error handling shared by ``kvtier plan`` and ``kvtier trace``.

Bad input is reported by the command's own parser (usage, an error line, exit status 2), never
as a traceback. Runs on the main thread.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

from kvtier.cli.common import UsageError
from kvtier.errors import KVTierError

_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}


def byte_size(text: str) -> int:
    """An argparse type: bytes, as an integer or with a unit (``16GiB``, ``500GB``, ``512MiB``)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected bytes such as 16GiB or 500GB, got {text!r}")
    value = int(float(match.group(1)) * _UNITS[unit])
    if not 0 <= value < 1 << 62:
        raise argparse.ArgumentTypeError(f"expected less than 2**62 bytes, got {text!r}")
    return value


#: Bad input to a command: reported by its parser (usage, error line, exit status 2).
Usage = UsageError


def command(
    run: Callable[[argparse.Namespace], int],
    *,
    out_of_memory: str = "lower --exact-limit, or coarsen the trace",
) -> Callable[[argparse.Namespace], int]:
    """A handler that turns bad input into its parser's error (exit 2, never a traceback);
    running out of memory is one too, with ``out_of_memory`` saying what to lower."""
    from kvtier.plan.cost import PlanInputError
    from kvtier.plan.trace_read import TraceError

    def handler(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except (Usage, TraceError, PlanInputError, KVTierError) as exc:
            args.plan_parser.error(str(exc))
        except MemoryError:
            args.plan_parser.error(f"out of memory: {out_of_memory}")
        raise AssertionError("unreachable: parser.error exits")

    return handler
