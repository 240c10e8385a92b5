"""``kvtier bench --engine sglang``: its options and entry point (SGLang runs in its own venv).

The options are ``engine_cli``'s (``--sglang-python``: the SGLang venv's python; ``--model``: a
model directory, default the SmolLM2 of ``make sglang-env``); unset ones take
``SglangBenchOptions``' (or ``QUICK``'s) values. Outputs default to
``OUTPUT_DIR/bench-sglang.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from kvtier.bench.engine_cli import check_strategies, require_chart_package, run_engine
from kvtier.cli.common import UsageError


def options_from(args: argparse.Namespace) -> Any:
    """``SglangBenchOptions``: defaults, then ``--quick``, then the options given."""
    from kvtier.bench import engine_cli
    from kvtier.bench.sglang_bench import QUICK, SglangBenchOptions

    python = getattr(args, "sglang_python", None) or ""
    return engine_cli.options_from(args, SglangBenchOptions, QUICK, sglang_python=python)


def check(options: Any) -> None:
    """``UsageError`` for a missing SGLang python or shims, a model that is not a directory,
    a strategy of another engine, or pools SGLang cannot build (host memory must be larger
    than the device pool)."""
    from kvtier.bench.sglang_bench import absolute_paths
    from kvtier.bench.sglang_strategies import STRATEGIES

    o = absolute_paths(options)
    if not os.access(o.sglang_python, os.X_OK):
        raise UsageError(
            f"argument --sglang-python: no python at {o.sglang_python} (build the SGLang "
            "venv with `make sglang-env`, or pass one with SGLang and kvtier)"
        )
    if not os.path.isdir(o.shims):
        raise UsageError(
            f"the SGLang CPU shims are not at {o.shims}: the SGLang bench runs from a "
            "source checkout of kvtier (tests/integrations/sglang/shims)"
        )
    if not os.path.isfile(f"{o.model}/config.json"):
        raise UsageError(f"argument --model: expected a model directory, got {o.model!r}")
    check_strategies(o.strategies, STRATEGIES, "sglang")
    if not 0 < o.device_convs < o.host_convs:
        raise UsageError("--host-convs must be larger than --device-convs, both positive")


def run(args: argparse.Namespace) -> int:
    """Run every strategy's server, print the table, write the JSON and the chart."""
    from kvtier.bench import sglang_report as report
    from kvtier.bench.sglang_bench import SglangBench

    require_chart_package()
    options = options_from(args)
    check(options)

    def to_json(bench: Any, reports: dict[str, Any], table: list[dict[str, Any]]) -> Any:
        return report.to_json(bench.options, bench.pools, reports, table)

    return run_engine(args, options, "sglang", SglangBench, report, to_json)
