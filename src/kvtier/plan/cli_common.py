"""Argument types, ``--memory-budget``, and the error handling shared by ``kvtier plan`` and
``kvtier trace``.

Bad input is reported by the command's own parser (usage, an error line, exit status 2), never
as a traceback. Runs on the main thread.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

from kvtier.cli.common import UsageError
from kvtier.errors import KVTierError
from kvtier.plan.budget import MAX_MEMORY_BUDGET, MIN_MEMORY_BUDGET, MemoryBudget, text_of

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
    value = float(match.group(1)) * _UNITS[unit]
    if not 0 <= value < 1 << 62:  # also inf: digits past a float's range
        raise argparse.ArgumentTypeError(f"expected less than 2**62 bytes, got {text!r}")
    return int(value)


def positive_byte_size(text: str) -> int:
    """``byte_size``, more than 0 (a host of no memory is no host, not "this machine's")."""
    value = byte_size(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected more than 0 bytes, got {text!r}")
    return value


#: Bad input to a command: reported by its parser (usage, error line, exit status 2).
Usage = UsageError


def command(
    run: Callable[[argparse.Namespace], int],
    *,
    out_of_memory: str | Callable[[argparse.Namespace], str],
) -> Callable[[argparse.Namespace], int]:
    """A handler that turns bad input into its parser's error (exit 2, never a traceback);
    running out of memory is one too, ``out of memory: `` and ``out_of_memory`` (or what it
    returns for the arguments) saying why and what to lower."""
    from kvtier.plan.cost import PlanInputError
    from kvtier.plan.trace_read import TraceError

    def handler(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except (Usage, TraceError, PlanInputError, KVTierError) as exc:
            args.plan_parser.error(str(exc))
        except MemoryError:
            why = out_of_memory if isinstance(out_of_memory, str) else out_of_memory(args)
            args.plan_parser.error(f"out of memory: {why}")
        raise AssertionError("unreachable: parser.error exits")

    return handler


def memory_budget(text: str) -> MemoryBudget:
    """An argparse type: ``--memory-budget`` in bytes with a unit (``8GiB``, ``512MiB``)."""
    value = byte_size(text)
    if not MIN_MEMORY_BUDGET <= value <= MAX_MEMORY_BUDGET:
        raise argparse.ArgumentTypeError(
            f"expected {text_of(MIN_MEMORY_BUDGET)} to 1 PiB, got {text!r}"
        )
    return MemoryBudget(value)


def add_memory_budget(group: argparse._ActionsContainer, what: str) -> None:
    """``--memory-budget`` on ``group``; ``what`` says what it bounds."""
    group.add_argument(
        "--memory-budget",
        type=memory_budget,
        default=MemoryBudget(),
        metavar="BYTES",
        help=f"the most memory {what} may take, at least 64MiB (default 8GiB); trace lines "
        "over a 256th of it (16MiB at most) are neither read nor written, but counted",
    )


def out_of_memory(what: str) -> Callable[[argparse.Namespace], str]:
    """The out-of-memory message of a command with ``--memory-budget``: ``what`` (``the
    plan``) is held within the budget, so the machine had less memory free than the budget."""

    def message(args: argparse.Namespace) -> str:
        return (
            f"{what} is held within {args.memory_budget}, and this machine had less memory "
            "free than that: lower --memory-budget to the memory that is free (an input that "
            "needs more is then refused with its size)"
        )

    return message
