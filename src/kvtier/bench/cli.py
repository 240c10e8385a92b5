"""``kvtier bench`` options and entry point (torch and transformers are imported when it runs)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from kvtier.bench import admission_cli, engine_cli, sglang_cli, vllm_cli
from kvtier.bench.outputs import output_paths, sweep_and_report
from kvtier.cli.common import UsageError, float_in, int_in
from kvtier.errors import KVTierError


def _defaults() -> dict[str, Any]:
    from kvtier.bench.runner import BenchOptions

    return {f.name: f.default for f in dataclasses.fields(BenchOptions)}


def _conversations(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 2,4,8, got {text!r}") from None
    if not values or min(values) <= 0 or max(values) > MAX_CONVERSATIONS:
        raise argparse.ArgumentTypeError(
            f"numbers of conversations must be from 1 to {MAX_CONVERSATIONS}, got {text}"
        )
    return values


#: Bounds of the numeric options (a run past them would not finish, or not fit in memory).
MAX_CONVERSATIONS = 4096
MAX_TOKENS = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``kvtier bench``; unset ones take ``BenchOptions``' (or ``--quick``'s) value."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smaller workload and sweep (2,4,8 conversations; < 1 min)",
    )
    parser.add_argument(
        "--model", help="tiny | small | base (random weights) or a model directory (small)"
    )
    parser.add_argument(
        "--conversations",
        type=_conversations,
        metavar="N,N,...",
        help="numbers of conversations to sweep (default 2,4,8,12,16,24)",
    )
    convs = float_in(0, MAX_CONVERSATIONS)
    parser.add_argument(
        "--device-convs",
        type=convs,
        metavar="N",
        help="conversations the accelerator KV pool holds (default 4)",
    )
    parser.add_argument(
        "--host-convs",
        type=convs,
        metavar="N",
        help="conversations host memory holds (default 12; --config overrides)",
    )
    _add_workload_arguments(parser.add_argument_group("workload"))
    parser.add_argument(
        "--config",
        dest="config_path",
        metavar="FILE",
        help="tiering config for the fullest strategy (default: host + fs)",
    )
    parser.add_argument("--output-dir", metavar="DIR", help="where results go (bench-results)")
    parser.add_argument(
        "--json", dest="json_path", metavar="FILE", help="JSON path (OUTPUT_DIR/bench.json)"
    )
    parser.add_argument(
        "--chart", dest="chart_path", metavar="FILE", help="PNG path (OUTPUT_DIR/bench.png)"
    )
    parser.add_argument(
        "--threads",
        type=int_in(1, 1024),
        metavar="N",
        help="torch threads, 1 to 1024 (1: stable timings)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--no-prefetch",
        action="store_true",
        help="do not hand the next request's prompt to TieredModel.prefetch ahead of time",
    )
    parser.add_argument(
        "--metrics-port",
        type=int_in(0, 65535),
        metavar="PORT",
        help="serve the fullest strategy's metrics on this port (0: any free port, printed)",
    )
    admission_cli.add_arguments(parser)
    engine_cli.add_arguments(parser)


def _add_workload_arguments(work: Any) -> None:
    tokens = int_in(1, MAX_TOKENS)
    work.add_argument(
        "--first-prompt-tokens", type=tokens, metavar="TOKENS", help="first prompt length (768)"
    )
    work.add_argument(
        "--rounds", type=int_in(1, 1000), metavar="N", help="turns after the first, 1 to 1000 (4)"
    )
    work.add_argument(
        "--user-turn-tokens", type=tokens, metavar="TOKENS", help="tokens per user turn (32)"
    )
    work.add_argument(
        "--new-tokens", type=tokens, metavar="TOKENS", help="tokens generated per turn (2)"
    )
    work.add_argument(
        "--block-size",
        type=int_in(1, 4096),
        metavar="TOKENS",
        help="engine block size in tokens (16)",
    )
    work.add_argument(
        "--blocks-per-chunk", type=int_in(1, 4096), metavar="N", help="blocks per kvtier chunk (2)"
    )
    work.add_argument(
        "--seed",
        type=int_in(0, (1 << 32) - 1),
        help="random seed of the workload, 0 to 2**32-1 (0)",
    )


def options_from(args: argparse.Namespace) -> Any:
    """``BenchOptions`` from parsed arguments: defaults, then ``--quick``, then explicit ones."""
    from kvtier.bench.runner import QUICK, BenchOptions

    values = {**_defaults(), **(QUICK if args.quick else {})}
    given = {k: v for k, v in vars(args).items() if k in values and v is not None}
    if getattr(args, "no_prefetch", False):
        given["prefetch"] = False
    return BenchOptions(**{**values, **given})


def run(args: argparse.Namespace) -> int:
    """Run the sweep, print the table and headline, write the JSON and the chart.

    Bad options (a missing model or config, an unwritable output, a port in use, capacities
    that hold nothing) raise ``UsageError`` before the sweep starts.
    """
    refuse_foreign_flags(args)
    if args.engine == "vllm":  # its own options and engines (vllm_cli)
        return vllm_cli.run(args)
    if args.engine == "sglang":  # its own options and servers (sglang_cli)
        return sglang_cli.run(args)
    options = options_from(args)
    check_options(options)
    json_path, chart_path = _output_paths(args, options)
    if args.admission:  # policies side by side instead of the sweep (admission_cli)
        if args.metrics_port is not None:
            raise UsageError("argument --metrics-port: not with --admission")
        bench = _build(options)
        _check_capacities(bench)
        return admission_cli.run(args, bench, json_path, chart_path)
    server, collector = (None, None) if args.metrics_port is None else _serve(args.metrics_port)
    try:
        bench = _build(options)
        if collector is not None:
            _watch(bench, collector)
        _check_capacities(bench)
        _sweep(bench, args.no_progress, json_path, chart_path)
    finally:
        if server is not None:
            server.close()
    return 0


#: Flags only the engine benches read (dest -> flag), and those only ``--engine transformers``
#: reads; each engine's python only that engine.
ENGINE_FLAGS = {"repeats": "--repeat", "concurrency": "--concurrency", "mix": "--mix",
                "strategies": "--strategies"}  # fmt: skip
TRANSFORMERS_FLAGS = {"admission": "--admission", "config_path": "--config",
                      "threads": "--threads", "metrics_port": "--metrics-port",
                      "no_prefetch": "--no-prefetch", "block_size": "--block-size",
                      "blocks_per_chunk": "--blocks-per-chunk",
                      "one_shots_per_round": "--one-shots",
                      "frequency_window": "--frequency-window"}  # fmt: skip
PYTHON_FLAGS = {"vllm": ("vllm_python", "--vllm-python"),
                "sglang": ("sglang_python", "--sglang-python")}  # fmt: skip


def refuse_foreign_flags(args: argparse.Namespace) -> None:
    """``UsageError`` for a flag the chosen ``--engine`` would ignore (a ``--repeat`` that gave
    one transformers sweep and no verdict, silently)."""
    engine = args.engine
    foreign = dict(TRANSFORMERS_FLAGS) if engine != "transformers" else dict(ENGINE_FLAGS)
    foreign |= {d: f for name, (d, f) in PYTHON_FLAGS.items() if name != engine}
    for dest, flag in foreign.items():
        value = getattr(args, dest, None)
        if value is not None and value is not False:  # 0 is given (--metrics-port 0)
            raise UsageError(f"argument {flag}: not with --engine {engine}")


def _sweep(bench: Any, no_progress: bool, json_path: Path, chart_path: Path) -> None:
    from kvtier.bench import report

    print(_describe(bench), file=sys.stderr)
    sweep_and_report(bench, report, bench.options.config_path, no_progress, (json_path, chart_path))


def check_options(options: Any) -> None:
    """``UsageError`` for a model that is neither a preset nor a directory, a bad ``--config``,
    or conversations longer than a preset model's 16384 positions."""
    from kvtier.bench.engine import MODEL_PRESETS
    from kvtier.config.schema import TieringConfig

    if options.model not in MODEL_PRESETS and not os.path.isdir(options.model):
        presets = ", ".join(MODEL_PRESETS)
        raise UsageError(
            f"argument --model: expected {presets} or a model directory, got {options.model!r}"
        )
    if options.config_path is not None:
        try:
            TieringConfig.load(options.config_path)
        except KVTierError as exc:
            raise UsageError(f"argument --config: {exc}") from None
    longest = options.spec(1, 1).max_context_tokens
    if options.block_size * options.blocks_per_chunk > longest:
        raise UsageError(
            f"a chunk of {options.block_size * options.blocks_per_chunk} tokens is "
            f"longer than a whole conversation ({longest} tokens)"
        )
    if options.model in MODEL_PRESETS and longest > MAX_POSITIONS:
        raise UsageError(
            f"a conversation grows to {longest} tokens; the {options.model} model has "
            f"{MAX_POSITIONS} positions (shorten the prompts or the rounds)"
        )


#: Positions of the preset models (``max_position_embeddings`` in ``engine.build_model``).
MAX_POSITIONS = 16384


def _output_paths(args: argparse.Namespace, options: Any) -> tuple[Path, Path]:
    stem = "admission" if getattr(args, "admission", False) else "bench"
    return output_paths(args, options.output_dir, stem)


def _build(options: Any) -> Any:
    from kvtier.bench.runner import Bench

    try:
        return Bench(options)
    except KVTierError as exc:
        raise UsageError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"argument --model: cannot load {options.model} ({exc})") from None


def _check_capacities(bench: Any) -> None:
    """``UsageError`` unless host memory holds a chunk and fits this host's memory."""
    from kvtier.config.schema import TieringConfig

    caps = bench.capacities()
    flag = "--config" if bench.options.config_path else "--host-convs"
    if caps["host_bytes"] < caps["chunk_bytes"]:
        raise UsageError(
            f"argument {flag}: host memory of {caps['host_bytes']} bytes holds "
            f"no chunk ({caps['chunk_bytes']} bytes)"
        )
    try:
        config = TieringConfig.from_dict({"cpu_bytes_to_use": caps["host_bytes"]})
        config.host_slots(caps["chunk_bytes"])
    except KVTierError as exc:
        raise UsageError(f"argument {flag}: {exc}") from None


def _export_metrics(bench: Any, port: int) -> Any:
    """Serve ``/metrics`` of whichever run of the fullest strategy is active."""
    server, collector = _serve(port)
    _watch(bench, collector)
    return server


def _serve(port: int) -> tuple[Any, Any]:
    """A metrics server on 127.0.0.1 (``port`` 0: any free port) and the collector it serves."""
    from prometheus_client import CollectorRegistry

    from kvtier.telemetry.endpoint import MetricsServer
    from kvtier.telemetry.metrics import DelegatingCollector

    collector = DelegatingCollector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server = MetricsServer(registry, port, "127.0.0.1")
    except OSError as exc:
        reason = exc.strerror or exc
        raise UsageError(
            f"argument --metrics-port: cannot listen on 127.0.0.1:{port} ({reason})"
        ) from None
    print(f"metrics on http://127.0.0.1:{server.port}/metrics", file=sys.stderr)
    return server, collector


def _watch(bench: Any, collector: Any) -> None:
    def watch(run: Any) -> None:
        collector.current = run.manager.prometheus_collector()

    bench.on_full_run = watch
    print(f"metrics are those of {bench.strategy_names()[2]}", file=sys.stderr)


def _describe(bench: Any) -> str:
    caps, layout = bench.capacities(), bench.identity.layout
    return (
        f"model {bench.options.model}: {layout.num_layers} layers x {layout.num_kv_heads} KV "
        f"heads x {layout.head_dim}, {layout.dtype}; chunk {caps['chunk_tokens']} tokens "
        f"({caps['chunk_bytes'] >> 10} KiB); a conversation is {caps['chunks_per_conversation']}"
        f" chunks; accelerator pool {caps['device_conversations']:g} conversations, host "
        f"{caps['host_conversations']:g}; strategies: {', '.join(bench.strategy_names())}"
    )
