"""``kvtier bench --admission``: its options and entry point (wired in by ``bench.cli``).

The bench's own options keep their meaning (model, capacities, prompt sizes, ``--config`` for
the tiers, outputs); ``--conversations`` defaults to 8 and the outputs to
``OUTPUT_DIR/admission.json`` and ``admission.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvtier.cli.common import int_in


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--admission`` and the options of the mixed workload."""
    group = parser.add_argument_group("admission (--admission)")
    group.add_argument(
        "--admission",
        action="store_true",
        help="compare admission policies on reused conversations among one-shot prompts",
    )
    group.add_argument(
        "--one-shots",
        dest="one_shots_per_round",
        type=int_in(0, 1 << 16),
        metavar="N",
        help="one-shot prompts per round (16)",
    )
    group.add_argument(
        "--one-shot-tokens",
        type=int_in(1, 1 << 20),
        metavar="TOKENS",
        help="tokens of a one-shot prompt (--first-prompt-tokens)",
    )
    group.add_argument(
        "--frequency-window",
        type=int_in(1, 1 << 40),
        metavar="N",
        help="sightings between halvings of the frequency filter (8x host slots)",
    )


def options_from(args: argparse.Namespace, bench: Any) -> Any:
    """``AdmissionOptions`` over the bench's options ``bench`` (``--conversations`` unset: 8)."""
    import dataclasses

    from kvtier.bench.admission import ADMISSION_CONVERSATIONS, AdmissionOptions

    if args.conversations is None:
        bench = dataclasses.replace(bench, conversations=ADMISSION_CONVERSATIONS)
    given = {
        name: getattr(args, name, None)
        for name in ("one_shots_per_round", "one_shot_tokens", "frequency_window")
    }
    return AdmissionOptions(bench, **{k: v for k, v in given.items() if v is not None})


def run(args: argparse.Namespace, built: Any, json_path: Path, chart_path: Path) -> int:
    """Compare the policies, print the table and headline, write the JSON and the chart.

    ``built``: the ``Bench`` of the parsed options (model and identity), already checked.
    """
    from kvtier.bench import admission_report as report
    from kvtier.bench.admission import AdmissionBench
    from kvtier.bench.outputs import sweep_and_report

    options = options_from(args, built.options)
    bench = AdmissionBench(options, built)
    print(_describe(bench), file=sys.stderr)
    paths = (json_path, chart_path)
    sweep_and_report(bench, report, options.bench.config_path, args.no_progress, paths)
    return 0


def _describe(bench: Any) -> str:
    caps = bench.capacities()
    options = bench.options
    return (
        f"admission: {', '.join(p.name for p in bench.policies())}; a conversation is "
        f"{caps['chunks_per_conversation']} chunks, a one-shot {caps['one_shot_chunks']}, "
        f"{options.one_shots_per_round} one-shots per round; accelerator pool "
        f"{caps['device_conversations']:g} conversations, host {caps['host_conversations']:g} "
        f"({caps['host_chunks']} chunks)"
    )
