"""What a bench run leaves: the sweep with its progress bar, the table it prints, and the JSON and
chart it writes, at paths checked before the run starts. Shared by every ``kvtier bench`` mode.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from kvtier.bench import provenance
from kvtier.cli.common import UsageError
from kvtier.cli.files import check_output
from kvtier.errors import KVTierError


def sweep_and_report(
    bench: Any, report: Any, config_path: Any, no_progress: bool, paths: tuple[Path, Path]
) -> None:
    """Warm ``bench`` up, run its sweep with a progress bar, print and write ``report``'s table,
    JSON and chart. A configuration that cannot start is a usage error naming ``--config``."""
    from tqdm import tqdm

    json_path, chart_path = paths
    try:
        bench.warm_up()  # builds every strategy's manager and tiers a first time
    except KVTierError as exc:
        flag = "argument --config: " if config_path else ""
        raise UsageError(f"{flag}{exc}") from None
    with tqdm(total=bench.num_requests(), unit="req", disable=no_progress) as bar:
        sweep = bench.sweep(bar)
    table = report.rows(sweep)
    document = report.to_json(sweep, table)
    print(report.format_table(table))
    print(report.format_headline(document["headline"]))
    provenance.write_json(document, json_path)
    report.write_chart(sweep, table, chart_path)
    print(f"wrote {json_path} and {chart_path}")


def output_paths(args: argparse.Namespace, output_dir: str, stem: str) -> tuple[Path, Path]:
    """The JSON and chart paths (``--json``, ``--chart``, else ``OUTPUT_DIR/STEM.json`` and
    ``.png``); ``UsageError`` unless their directories can be written and neither path is
    something else than a regular file (a FIFO would hang the end of a run)."""
    out = Path(output_dir)
    json_path = Path(args.json_path) if args.json_path else out / f"{stem}.json"
    chart_path = Path(args.chart_path) if args.chart_path else out / f"{stem}.png"
    for flag, directory in (
        ("--output-dir", out),
        ("--json", json_path.parent),
        ("--chart", chart_path.parent),
    ):
        _check_writable(flag, directory)
    check_output(json_path, "argument --json" if args.json_path else "argument --output-dir")
    check_output(chart_path, "argument --chart" if args.chart_path else "argument --output-dir")
    return json_path, chart_path


def _check_writable(flag: str, directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = getattr(exc, "strerror", None) or exc
        raise UsageError(f"argument {flag}: cannot write in {directory} ({reason})") from None
