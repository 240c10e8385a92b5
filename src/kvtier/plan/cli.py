"""``kvtier plan TRACE`` and ``kvtier trace synth|from-events``: argument parsing and output.

Bad input (an unreadable or empty trace, a bad option, an unwritable output) is reported the
way ``kvtier.cli`` reports it: usage, ``kvtier: error: ...``, exit status 2, no traceback.
Bad lines inside a trace are skipped and counted in the report. Runs on the main thread.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvtier.cli_types import float_in, int_in
from kvtier.layout import DTYPE_SIZES
from kvtier.plan.cli_common import Usage, byte_size, command
from kvtier.plan.trace_cli import add_trace_commands


def add_plan_commands(commands: Any) -> None:
    """Register ``kvtier plan`` and ``kvtier trace`` on the ``kvtier`` subcommands."""
    plan = commands.add_parser(
        "plan",
        help="should I tier, and how big? (from a request trace)",
        description="Analyze a request trace: reuse, miss-ratio curves, a verdict, sizes.",
    )
    plan.add_argument("trace", help="trace file (JSONL; see kvtier.plan.trace)")
    _model_arguments(plan)
    _machine_arguments(plan)
    out = plan.add_argument_group("outputs")
    out.add_argument("--output-dir", default="plan-results", help="for plan.json and plan.png")
    out.add_argument("--json", dest="json_path", help="JSON path (OUTPUT_DIR/plan.json)")
    out.add_argument("--chart", dest="chart_path", help="PNG path (OUTPUT_DIR/plan.png)")
    out.add_argument("--no-chart", action="store_true", help="skip the PNG")
    out.add_argument("--emit-config", metavar="FILE", help="write the recommended kvtier config")
    out.add_argument("--emit-vllm", metavar="FILE", help="write vLLM's --kv-transfer-config JSON")
    out.add_argument("--config", help="a kvtier config to base the emitted configs on")
    out.add_argument("--fs-root", default="/mnt/kv-cache", help="root_dir of an emitted fs tier")
    out.add_argument("--target", choices=("vllm-cpu", "vllm-cuda"),
                     help="the vLLM build the --kv-transfer-config is for (default: the one "
                     "installed here; vllm-cuda when there is none)")  # fmt: skip
    plan.set_defaults(handler=command(_run_plan), plan_parser=plan)
    add_trace_commands(commands)


def _model_arguments(plan: Any) -> None:
    model = plan.add_argument_group("model and layout (defaults: Llama-3-8B, bfloat16)")
    size = int_in(1, 1 << 16)
    model.add_argument("--num-layers", type=size, default=32)
    model.add_argument("--num-kv-heads", type=size, default=8)
    model.add_argument("--head-dim", type=size, default=128)
    model.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_SIZES))
    model.add_argument(
        "--bytes-per-token",
        type=int_in(1, 1 << 40),
        help="KV bytes per token (instead of the shape above)",
    )
    model.add_argument("--engine-block-size", type=size, default=None,
                       help="tokens per engine block (default: the target's, 128 on vllm-cpu, "
                       "16 on vllm-cuda)")  # fmt: skip
    model.add_argument("--chunk-tokens", type=int_in(1, 1 << 20), help="force this chunk size")
    model.add_argument(
        "--trace-chunk-tokens",
        type=int_in(1, 1 << 20),
        help="chunk_tokens of a trace without a header (default 16)",
    )


def _machine_arguments(plan: Any) -> None:
    machine = plan.add_argument_group("machine and budget")
    machine.add_argument(
        "--device-bytes",
        type=byte_size,
        default="16GiB",
        help="the accelerator's KV pool (default 16GiB)",
    )
    machine.add_argument("--host-memory", type=byte_size, help="default: this machine's")
    machine.add_argument("--max-cpu-bytes", type=byte_size,
                         help="cap on cpu_bytes_to_use (default: half of this machine's "
                         "physical memory, so that the printed line starts here)")  # fmt: skip
    machine.add_argument(
        "--process-bytes",
        type=byte_size,
        default="8GiB",
        help="host memory the serving process needs (default 8GiB)",
    )
    machine.add_argument(
        "--page-cache-bytes",
        type=byte_size,
        help="page cache kept for a fs tier (default 10%% of memory, <= 8GiB)",
    )
    machine.add_argument("--max-fs-bytes", type=byte_size, default="2TiB")
    machine.add_argument("--prefill-tokens-per-s", type=float_in(0, 1e9))
    machine.add_argument("--fs-read-gbps", type=float_in(0, 1e4), help="GB/s")
    machine.add_argument("--host-to-device-gbps", type=float_in(0, 1e4), help="GB/s")
    machine.add_argument(
        "--calibrate",
        nargs="?",
        const="fs",
        metavar="BENCH_JSON",
        help="measure this machine's fs tier, or read a kvtier bench JSON",
    )
    machine.add_argument("--calibrate-dir", help="where --calibrate writes (temp dir)")
    machine.add_argument(
        "--exact-limit",
        type=int,
        default=2_000_000,
        help="references analyzed exactly; more are sampled (SHARDS)",
    )
    machine.add_argument(
        "--arc-limit", type=int, default=50_000, help="references of the ARC miniature simulations"
    )


def _run_plan(args: argparse.Namespace) -> int:
    from kvtier.plan.analysis import analyze
    from kvtier.plan.report import text, to_json, write_json
    from kvtier.plan.trace_read import read_trace
    from kvtier.plan.verdict import recommend

    base = _base_config(args.config)
    json_path, chart_path = _output_paths(args)
    _resolve_target(args)
    trace = read_trace(args.trace, args.trace_chunk_tokens)
    analysis = analyze(trace, _options(args))
    recommendation = recommend(analysis, _rates(args, analysis.chunk_bytes))
    print(text(analysis, recommendation, args.trace))
    write_json(to_json(analysis, recommendation, args.trace), json_path)
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
    from kvtier.config_checks import physical_memory_bytes
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
    from kvtier.config import TieringConfig

    TieringConfig.load(path)  # ConfigError (a KVTierError) names what is wrong
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


def _output_paths(args: argparse.Namespace) -> tuple[Path, Path | None]:

    out = Path(args.output_dir)
    json_path = Path(args.json_path) if args.json_path else out / "plan.json"
    chart = (
        None if args.no_chart else Path(args.chart_path) if args.chart_path else out / "plan.png"
    )
    for path in (json_path, chart):
        if path is None:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Usage(f"cannot write {path}: {exc.strerror or exc}") from None
    return json_path, chart


def _chart(analysis: Any, recommendation: Any, path: Path, name: str) -> bool:
    from kvtier.plan.report import write_chart

    try:
        write_chart(analysis, recommendation, path, f"kvtier plan: {Path(name).name}")
    except ImportError:
        print(
            "kvtier: warning: no chart: matplotlib is missing (pip install 'kvtier[bench]')",
            file=sys.stderr,
        )
        return False
    return True


def _emit(
    analysis: Any, recommendation: Any, args: argparse.Namespace, base: dict[str, Any] | None
) -> list[str]:
    """Print vLLM's line; write the configs asked for (each checked first); their paths."""
    from kvtier.config import TieringConfig
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
    shape = Shape(args.num_layers, args.num_kv_heads, args.head_dim, args.dtype,
                  args.engine_block_size)  # fmt: skip
    if args.bytes_per_token:  # the shape flags do not describe the model: check the structure
        shape = Shape(1, 1, 1, "uint8", args.engine_block_size)
    check_vllm(line.config, args.target, shape)  # what is printed starts that vLLM
    flag = shlex.quote(json.dumps(line.config, separators=(",", ":")))
    print(f"vLLM target:   {args.target} ({args.target_why})")
    print(f"vLLM: --kv-transfer-config {flag}")
    for note in line.notes:
        print(f"vLLM note:     {note}")
    return line.config


def _write(path: str, text: str, flag: str) -> str:
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise Usage(f"{flag} {path}: {exc.strerror or exc}") from None
    return path
