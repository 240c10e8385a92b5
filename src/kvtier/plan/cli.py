"""``kvtier plan TRACE`` and ``kvtier trace synth|from-events``: argument parsing and output.

Bad input (an unreadable or empty trace, a bad option, an unwritable output) is reported the
way ``kvtier.cli.main`` reports it: usage, ``kvtier: error: ...``, exit status 2, no traceback.
Bad lines inside a trace are skipped and counted in the report. Runs on the main thread.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvtier.cli.common import add_model_shape, float_in, int_in
from kvtier.cli.files import atomic_output, check_output
from kvtier.layout import DTYPE_SIZES
from kvtier.plan.cli_common import (
    Usage,
    add_memory_budget,
    byte_size,
    command,
    out_of_memory,
    positive_byte_size,
)
from kvtier.plan.trace_cli import add_trace_commands


def add_plan_commands(commands: Any) -> None:
    """Register ``kvtier plan`` and ``kvtier trace`` on the ``kvtier`` subcommands."""
    plan = commands.add_parser(
        "plan",
        help="should I tier, and how big? (from a request trace)",
        description="Analyze a request trace: reuse, miss-ratio curves, a verdict, sizes.",
    )
    plan.add_argument(
        "trace",
        help="request trace, one JSON request a line: from kvtier trace "
        "synth or from-events, or recorded (trace_path)",
    )
    _model_arguments(plan)
    _machine_arguments(plan)
    out = plan.add_argument_group("outputs")
    out.add_argument(
        "--output-dir",
        default="plan-results",
        metavar="DIR",
        help="for plan.json and plan.png (made if missing)",
    )
    out.add_argument(
        "--json", dest="json_path", metavar="FILE", help="JSON path (default: OUTPUT_DIR/plan.json)"
    )
    out.add_argument(
        "--chart", dest="chart_path", metavar="FILE", help="PNG path (default: OUTPUT_DIR/plan.png)"
    )
    out.add_argument("--no-chart", action="store_true", help="skip the PNG")
    out.add_argument("--emit-config", metavar="FILE", help="write the recommended kvtier config")
    out.add_argument("--emit-vllm", metavar="FILE", help="write vLLM's --kv-transfer-config JSON")
    out.add_argument(
        "--config", metavar="FILE", help="a kvtier config to base the emitted configs on"
    )
    out.add_argument(
        "--fs-root",
        type=_fs_root,
        default="/mnt/kv-cache",
        metavar="DIR",
        help="root_dir of an emitted fs tier",
    )
    out.add_argument(
        "--target",
        choices=("vllm-cpu", "vllm-cuda"),
        help="the vLLM build the --kv-transfer-config is for (default: the one "
        "installed here; vllm-cuda when there is none)",
    )
    plan.set_defaults(
        handler=command(_run_plan, out_of_memory=out_of_memory("the plan")),
        plan_parser=plan,
        command_parser=plan,
    )
    add_trace_commands(commands)


def _fs_root(text: str) -> str:
    """An argparse type: a directory path (not empty, no NUL)."""
    if not text or "\0" in text:
        raise argparse.ArgumentTypeError(f"expected a directory path, got {text!r}")
    return text


def _model_arguments(plan: Any) -> None:
    model = plan.add_argument_group("model and layout (defaults: Llama-3-8B, bfloat16)")
    add_model_shape(model)
    size = int_in(1, 1 << 16)
    model.add_argument(
        "--bytes-per-token",
        type=int_in(1, 1 << 40),
        metavar="BYTES",
        help="KV bytes per token, all layers (instead of the shape above)",
    )
    model.add_argument(
        "--engine-block-size",
        type=size,
        default=None,
        metavar="TOKENS",
        help="tokens per engine block (default: the target's, 128 on vllm-cpu, 16 on vllm-cuda)",
    )
    model.add_argument(
        "--chunk-tokens",
        type=int_in(1, 1 << 20),
        metavar="TOKENS",
        help="force this chunk size (default: the one the plan finds best)",
    )
    model.add_argument(
        "--trace-chunk-tokens",
        type=int_in(1, 1 << 20),
        metavar="TOKENS",
        help="chunk_tokens of a trace without a header (default 16)",
    )


def _machine_arguments(plan: Any) -> None:
    machine = plan.add_argument_group(
        "machine and budget", "BYTES take a unit: 16GiB, 500GB, 512MiB (bytes without one)."
    )
    machine.add_argument(
        "--device-bytes",
        type=byte_size,
        metavar="BYTES",
        default="16GiB",
        help="the accelerator's KV pool (default 16GiB)",
    )
    machine.add_argument(
        "--host-memory",
        type=positive_byte_size,
        metavar="BYTES",
        help="host memory (default: this machine's)",
    )
    machine.add_argument(
        "--max-cpu-bytes",
        type=byte_size,
        metavar="BYTES",
        help="cap on cpu_bytes_to_use (default: half of this machine's "
        "physical memory, so that the printed line starts here)",
    )
    machine.add_argument(
        "--process-bytes",
        type=byte_size,
        metavar="BYTES",
        default="8GiB",
        help="host memory the serving process needs (default 8GiB)",
    )
    machine.add_argument(
        "--page-cache-bytes",
        type=byte_size,
        metavar="BYTES",
        help="page cache kept for a fs tier (default 10%% of memory, <= 8GiB)",
    )
    machine.add_argument(
        "--max-fs-bytes",
        type=byte_size,
        default="2TiB",
        metavar="BYTES",
        help="largest fs tier to recommend",
    )
    machine.add_argument(
        "--prefill-tokens-per-s",
        type=float_in(0, 1e9),
        metavar="PER_S",
        help="the engine's prefill rate, tokens per second (default: from a "
        "--calibrate bench JSON, else 10000)",
    )
    machine.add_argument(
        "--fs-read-gbps",
        type=float_in(0, 1e4),
        metavar="GB_S",
        help="fs tier read throughput, GB/s (default: measured by --calibrate, else 2)",
    )
    machine.add_argument(
        "--host-to-device-gbps",
        type=float_in(0, 1e4),
        metavar="GB_S",
        help="host-to-accelerator copy throughput, GB/s (default 20)",
    )
    machine.add_argument(
        "--calibrate",
        nargs="?",
        const="fs",
        metavar="BENCH_JSON",
        help="measure this machine's fs tier, or read a kvtier bench JSON",
    )
    machine.add_argument(
        "--calibrate-dir",
        metavar="DIR",
        help="where --calibrate writes (default: a temporary directory)",
    )
    machine.add_argument(
        "--exact-limit",
        type=int_in(1, 1 << 40),
        default=2_000_000,
        metavar="N",
        help="references analyzed exactly (at least 1000); more are sampled (SHARDS)",
    )
    machine.add_argument(
        "--arc-limit",
        type=int_in(1, 1 << 40),
        default=50_000,
        metavar="N",
        help="references of the ARC miniature simulations (at least 1000)",
    )
    add_memory_budget(machine, "reading and analyzing the trace")


def _run_plan(args: argparse.Namespace) -> int:
    from kvtier.plan.analysis import analyze
    from kvtier.plan.report import json_text, text, to_json
    from kvtier.plan.trace_read import read_trace
    from kvtier.plan.verdict import recommend

    base = _base_config(args.config)
    json_path, chart_path = _output_paths(args)
    _resolve_target(args)
    trace = read_trace(args.trace, args.trace_chunk_tokens, args.memory_budget)
    analysis = analyze(trace, _options(args))
    recommendation = recommend(analysis, _rates(args, analysis.chunk_bytes))
    print(text(analysis, recommendation, args.trace))
    _write(json_path, json_text(to_json(analysis, recommendation, args.trace)), "--json")
    written = [str(json_path)]
    if chart_path is not None and _chart(analysis, recommendation, chart_path, args.trace):
        written.append(str(chart_path))
    written += _emit(analysis, recommendation, args, base)
    print("wrote " + ", ".join(written))
    return 0


def _resolve_target(args: argparse.Namespace) -> None:
    """``args.target`` (with ``args.target_why``) and the engine block size it implies."""
    from kvtier.integrations.vllm.check import ENGINE_BLOCK, installed_target

    given = args.target is not None
    args.target, args.target_why = (args.target, "--target") if given else installed_target()
    args.engine_block_size = args.engine_block_size or ENGINE_BLOCK[args.target]


def _options(args: argparse.Namespace) -> Any:
    from kvtier.plan.analysis import PlanOptions

    per_token = args.bytes_per_token or (
        args.num_layers * args.num_kv_heads * args.head_dim * 2 * DTYPE_SIZES[args.dtype]
    )
    return PlanOptions(
        bytes_per_token=per_token,
        engine_block_size=args.engine_block_size,
        chunk_tokens=args.chunk_tokens,
        device_bytes=args.device_bytes,
        host_memory=args.host_memory,
        **_cpu_cap(args.max_cpu_bytes),
        process_bytes=args.process_bytes,
        page_cache_bytes=args.page_cache_bytes,
        max_fs_bytes=args.max_fs_bytes,
        exact_limit=max(1000, args.exact_limit),
        arc_limit=max(1000, args.arc_limit),
    )


def _cpu_cap(given: int | None) -> dict[str, Any]:
    """``max_cpu_bytes`` and its reason: ``--max-cpu-bytes``, else half of this machine's
    physical memory (no cap where that is unknown)."""
    from kvtier.config.checks import physical_memory_bytes
    from kvtier.plan.verdict import size

    if given is not None:
        return {"max_cpu_bytes": given, "max_cpu_reason": "--max-cpu-bytes"}
    physical = physical_memory_bytes()
    if physical is None:
        return {}
    reason = f"half of this machine's {size(physical)} of memory; --max-cpu-bytes raises it"
    return {"max_cpu_bytes": physical // 2, "max_cpu_reason": reason}


def _rates(args: argparse.Namespace, chunk_bytes: int) -> Any:
    from dataclasses import replace

    from kvtier.plan.cost import DEFAULTS, calibrate_fs, from_bench_json

    rates = DEFAULTS
    if args.calibrate == "fs":
        rates = calibrate_fs(rates, chunk_bytes, args.calibrate_dir)
    elif args.calibrate:
        rates = from_bench_json(rates, args.calibrate)
    given = {
        "prefill_tokens_per_s": args.prefill_tokens_per_s,
        "fs_read_bps": args.fs_read_gbps and args.fs_read_gbps * 1e9,
        "host_to_device_bps": args.host_to_device_gbps and args.host_to_device_gbps * 1e9,
    }
    given = {k: v for k, v in given.items() if v}
    return replace(rates, **given, source=rates.source + " + flags") if given else rates


def _base_config(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    from kvtier.config.schema import TieringConfig

    TieringConfig.load(path)  # ConfigError (a KVTierError) names what is wrong
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


def _output_paths(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """The JSON and chart paths, their directories made; ``Usage`` unless every output
    (``--emit-config`` and ``--emit-vllm`` too) can be written, checked before any work."""
    out = Path(args.output_dir)
    json_path = Path(args.json_path) if args.json_path else out / "plan.json"
    chart = (
        None if args.no_chart else Path(args.chart_path) if args.chart_path else out / "plan.png"
    )
    outputs = [
        ("--json" if args.json_path else "--output-dir", json_path),
        ("--chart" if args.chart_path else "--output-dir", chart),
    ]
    outputs += [("--emit-config", args.emit_config), ("--emit-vllm", args.emit_vllm)]
    for flag, path in outputs:
        if path is None:
            continue
        if flag in ("--json", "--chart", "--output-dir"):
            _make_directory(Path(path).parent, flag)
        check_output(path, flag)
    return json_path, chart


def _make_directory(directory: Path, flag: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise Usage(f"{flag}: {directory} is not a directory") from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise Usage(f"{flag}: cannot make directory {directory} ({reason})") from None


def _chart(analysis: Any, recommendation: Any, path: Path, name: str) -> bool:
    from kvtier.plan.report import write_chart

    try:
        write_chart(analysis, recommendation, path, f"kvtier plan: {Path(name).name}")
    except ImportError:
        print(
            "kvtier: warning: no chart: matplotlib is missing (pip install -e '.[bench]' in "
            "kvtier's clone)",
            file=sys.stderr,
        )
        return False
    return True


def _emit(
    analysis: Any, recommendation: Any, args: argparse.Namespace, base: dict[str, Any] | None
) -> list[str]:
    """Print vLLM's line; write the configs asked for (each checked first); their paths."""
    from kvtier.config.schema import TieringConfig
    from kvtier.plan.report import kvtier_config

    written = []
    if args.emit_config:
        config = kvtier_config(recommendation, analysis, args.fs_root, base)
        text = json.dumps(config, indent=2) + "\n"
        TieringConfig.from_json(text)  # what is emitted always loads
        written.append(_write(args.emit_config, text, "--emit-config"))
    line = _vllm(analysis, recommendation, args, base)
    if args.emit_vllm:
        written.append(_write(args.emit_vllm, json.dumps(line, indent=2) + "\n", "--emit-vllm"))
    return written


def _vllm(analysis: Any, recommendation: Any, args: argparse.Namespace, base: Any) -> Any:
    """vLLM's --kv-transfer-config for ``args.target``, checked as vLLM reads it, printed."""
    import shlex

    from kvtier.integrations.vllm.check import Shape, check_vllm
    from kvtier.plan.vllm_line import vllm_line

    line = vllm_line(recommendation, analysis, args.fs_root, args.target, base)
    shape = Shape(
        args.num_layers, args.num_kv_heads, args.head_dim, args.dtype, args.engine_block_size
    )
    if args.bytes_per_token:  # the shape flags do not describe the model: check the structure
        shape = Shape(1, 1, 1, "uint8", args.engine_block_size)
    check_vllm(line.config, args.target, shape)  # what is printed starts that vLLM
    flag = shlex.quote(json.dumps(line.config, separators=(",", ":")))
    print(f"vLLM target:   {args.target} ({args.target_why})")
    print(f"vLLM: --kv-transfer-config {flag}")
    for note in line.notes:
        print(f"vLLM note:     {note}")
    return line.config


def _write(path: str | Path, text: str, flag: str) -> str:
    """Write ``text`` to ``path`` whole, or not at all (``Usage`` naming ``flag``)."""
    with atomic_output(path, flag) as out:
        out.write(text)
    return str(path)
