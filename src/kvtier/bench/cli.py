"""``kvtier bench`` options and entry point (torch and transformers are imported when it runs)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any


def _defaults() -> dict[str, Any]:
    from kvtier.bench.runner import BenchOptions

    return {f.name: f.default for f in dataclasses.fields(BenchOptions)}


def _conversations(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 2,4,8, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError("numbers of conversations must be positive")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``kvtier bench``; unset ones take ``BenchOptions``' (or ``--quick``'s) value."""
    parser.add_argument("--quick", action="store_true", help="tiny model and workload (< 1 min)")
    parser.add_argument("--model", help="tiny | small | base (random weights) or a model dir")
    parser.add_argument(
        "--conversations",
        type=_conversations,
        metavar="N,N,...",
        help="numbers of conversations to sweep (default 2,4,8,12,16,24)",
    )
    parser.add_argument(
        "--device-convs", type=float, help="conversations the accelerator KV pool holds (default 4)"
    )
    parser.add_argument(
        "--host-convs",
        type=float,
        help="conversations host memory holds (default 12; --config overrides)",
    )
    work = parser.add_argument_group("workload")
    work.add_argument("--first-prompt-tokens", type=int, help="first prompt length (768)")
    work.add_argument("--rounds", type=int, help="turns after the first (4)")
    work.add_argument("--user-turn-tokens", type=int, help="tokens per user turn (32)")
    work.add_argument("--new-tokens", type=int, help="tokens generated per turn (2)")
    work.add_argument("--block-size", type=int, help="engine block size in tokens (16)")
    work.add_argument("--blocks-per-chunk", type=int, help="blocks per kvtier chunk (2)")
    work.add_argument("--seed", type=int)
    parser.add_argument(
        "--config",
        dest="config_path",
        metavar="FILE",
        help="tiering config for the fullest strategy (default: host + fs)",
    )
    parser.add_argument("--output-dir", help="where results go (bench-results)")
    parser.add_argument("--json", dest="json_path", help="JSON path (OUTPUT_DIR/bench.json)")
    parser.add_argument("--chart", dest="chart_path", help="PNG path (OUTPUT_DIR/bench.png)")
    parser.add_argument("--threads", type=int, help="torch threads (1: stable timings)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--metrics-port", type=int,
                        help="serve the fullest strategy's metrics on this port")  # fmt: skip


def options_from(args: argparse.Namespace) -> Any:
    """``BenchOptions`` from parsed arguments: defaults, then ``--quick``, then explicit ones."""
    from kvtier.bench.runner import QUICK, BenchOptions

    values = {**_defaults(), **(QUICK if args.quick else {})}
    given = {k: v for k, v in vars(args).items() if k in values and v is not None}
    return BenchOptions(**{**values, **given})


def run(args: argparse.Namespace) -> int:
    """Run the sweep, print the table and headline, write the JSON and the chart."""
    from tqdm import tqdm

    from kvtier.bench import report
    from kvtier.bench.runner import Bench

    options = options_from(args)
    out = Path(options.output_dir)
    json_path = Path(args.json_path) if args.json_path else out / "bench.json"
    chart_path = Path(args.chart_path) if args.chart_path else out / "bench.png"
    bench = Bench(options)
    exporter = None if args.metrics_port is None else _export_metrics(bench, args.metrics_port)
    print(_describe(bench), file=sys.stderr)
    bench.warm_up()
    with tqdm(total=bench.num_requests(), unit="req", disable=args.no_progress) as bar:
        sweep = bench.sweep(bar)
    table = report.rows(sweep)
    document = report.to_json(sweep, table)
    print(report.format_table(table))
    print(report.format_headline(document["headline"]))
    report.write_json(document, json_path)
    report.write_chart(sweep, table, chart_path)
    print(f"wrote {json_path} and {chart_path}")
    if exporter is not None:
        exporter.close()
    return 0


def _export_metrics(bench: Any, port: int) -> Any:
    """Serve ``/metrics`` of whichever run of the fullest strategy is active."""
    from prometheus_client import CollectorRegistry

    from kvtier.metrics import DelegatingCollector, MetricsServer

    collector = DelegatingCollector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)

    def watch(run: Any) -> None:
        collector.current = run.manager.prometheus_collector()

    bench.on_full_run = watch
    server = MetricsServer(registry, port, "127.0.0.1")
    print(f"metrics of {bench.strategy_names()[2]} on http://127.0.0.1:{server.port}/metrics",
          file=sys.stderr)  # fmt: skip
    return server


def _describe(bench: Any) -> str:
    caps, layout = bench.capacities(), bench.identity.layout
    return (
        f"model {bench.options.model}: {layout.num_layers} layers x {layout.num_kv_heads} KV "
        f"heads x {layout.head_dim}, {layout.dtype}; chunk {caps['chunk_tokens']} tokens "
        f"({caps['chunk_bytes'] >> 10} KiB); a conversation is {caps['chunks_per_conversation']}"
        f" chunks; accelerator pool {caps['device_conversations']:g} conversations, host "
        f"{caps['host_conversations']:g}; strategies: {', '.join(bench.strategy_names())}"
    )
