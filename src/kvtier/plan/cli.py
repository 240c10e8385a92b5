"""``kvtier plan TRACE`` and ``kvtier trace synth|from-events``: argument parsing and output.

Bad input (an unreadable or empty trace, a bad option, an unwritable output) is reported the
way ``kvtier.cli`` reports it: usage, ``kvtier: error: ...``, exit status 2, no traceback.
Bad lines inside a trace are skipped and counted in the report. Runs on the main thread.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtier.errors import KVTierError
from kvtier.layout import DTYPE_SIZES

_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}


def byte_size(text: str) -> int:
    """An argparse type: bytes, as an integer or with a unit (``16GiB``, ``500GB``, ``512MiB``)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected bytes such as 16GiB or 500GB, got {text!r}")
    value = int(float(match.group(1)) * _UNITS[unit])
    if not 0 <= value < 1 << 62:
        raise argparse.ArgumentTypeError(f"expected less than 2**62 bytes, got {text!r}")
    return value


class _Usage(Exception):
    """Bad input to a command: reported by its parser (usage, error line, exit status 2)."""


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {low} to {high}, got {value}")
        return value

    return parse


def float_in(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number above ``low`` and at most ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not low < value <= high:  # also false for NaN
            raise argparse.ArgumentTypeError(
                f"expected above {low:g}, at most {high:g}, got {text}"
            )
        return value

    return parse


def _command(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A handler that turns bad input into its parser's error (exit 2, never a traceback)."""
    from kvtier.plan.cost import PlanInputError
    from kvtier.plan.trace_read import TraceError

    def handler(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except (_Usage, TraceError, PlanInputError, KVTierError) as exc:
            args.plan_parser.error(str(exc))
        except MemoryError:
            args.plan_parser.error("out of memory: lower --exact-limit, or coarsen the trace")
        raise AssertionError("unreachable: parser.error exits")

    return handler


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
    out.add_argument("--config", help="a kvtier config to base --emit-config on")
    out.add_argument("--fs-root", default="/mnt/kv-cache", help="root_dir of an emitted fs tier")
    plan.set_defaults(handler=_command(_run_plan), plan_parser=plan)
    _add_trace_commands(commands)


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
    model.add_argument("--engine-block-size", type=size, default=16)
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
        "--arc-limit", type=int, default=100_000, help="references of the ARC miniature simulations"
    )


def _add_trace_commands(commands: Any) -> None:
    trace = commands.add_parser("trace", help="make request traces for kvtier plan")
    sub = trace.add_subparsers(dest="trace_command", required=True)
    synth = sub.add_parser("synth", help="write a synthetic workload's trace")
    synth.add_argument("--kind", choices=("chat", "rag", "unique", "mix"), default="mix")
    synth.add_argument("--out", required=True, help="trace file to write")
    count = int_in(1, 1 << 40)
    synth.add_argument("--requests", type=count, default=10_000)
    synth.add_argument("--chunk-tokens", type=int_in(1, 1 << 20), default=64)
    synth.add_argument("--rate", type=float_in(0, 1e9), default=20.0, help="requests/s")
    synth.add_argument("--seed", type=int, default=0)
    for name, default in (
        ("conversations", 16),
        ("first-prompt", 768),
        ("rounds", 4),
        ("user", 32),
        ("answer", 2),
        ("system", 512),
        ("documents", 1000),
        ("document", 2048),
        ("question", 64),
        ("unique-prompt", 1024),
        ("output", 128),
    ):
        synth.add_argument(f"--{name}", type=int_in(0, 1 << 30), default=default)
    synth.add_argument("--zipf", type=float_in(1, 100), default=1.1)
    synth.add_argument("--mix", default="0.4,0.4,0.2", help="chat,rag,unique shares")
    synth.set_defaults(handler=_command(_synth), plan_parser=synth)
    events = sub.add_parser("from-events", help="convert a capture of vLLM-format KV events")
    events.add_argument("capture", help="concatenated msgpack KVEventBatch payloads")
    events.add_argument("--out", required=True, help="trace file to write")
    events.add_argument("--medium", default="GPU", help="medium of the stores to read, or any")
    events.add_argument(
        "--merge-within",
        type=float,
        default=1.0,
        help="seconds within which a store continues the previous request",
    )
    events.set_defaults(handler=_command(_from_events), plan_parser=events)


def _run_plan(args: argparse.Namespace) -> int:
    from kvtier.plan.analysis import analyze
    from kvtier.plan.report import text, to_json, write_json
    from kvtier.plan.trace_read import read_trace
    from kvtier.plan.verdict import recommend

    base = _base_config(args.config)
    json_path, chart_path = _output_paths(args)
    trace = read_trace(args.trace, args.trace_chunk_tokens)
    analysis = analyze(trace, _options(args))
    recommendation = recommend(analysis, _rates(args, analysis.chunk_bytes))
    print(text(analysis, recommendation, args.trace))
    write_json(to_json(analysis, recommendation, args.trace), json_path)
    written = [str(json_path)]
    if chart_path is not None and _chart(analysis, recommendation, chart_path, args.trace):
        written.append(str(chart_path))
    if args.emit_config:
        _emit(analysis, recommendation, args, base)
        written.append(args.emit_config)
    print("wrote " + ", ".join(written))
    return 0


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
        process_bytes=args.process_bytes,
        page_cache_bytes=args.page_cache_bytes,
        max_fs_bytes=args.max_fs_bytes,
        exact_limit=max(1000, args.exact_limit),
        arc_limit=max(1000, args.arc_limit),
    )


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
            raise _Usage(f"cannot write {path}: {exc.strerror or exc}") from None
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
) -> None:
    from kvtier.config import TieringConfig
    from kvtier.plan.report import kvtier_config, vllm_config

    config = kvtier_config(recommendation, analysis, args.fs_root, base)
    text = json.dumps(config, indent=2) + "\n"
    TieringConfig.from_json(text)  # what is emitted always loads
    try:
        Path(args.emit_config).write_text(text)
    except OSError as exc:
        raise _Usage(f"--emit-config {args.emit_config}: {exc.strerror or exc}") from None
    flag = json.dumps(vllm_config(config), separators=(",", ":"))
    print(f"vLLM: --kv-transfer-config '{flag}'")


def _synth(args: argparse.Namespace) -> int:
    from kvtier.plan.synth import SynthSpec, write

    try:
        mix = tuple(float(x) for x in args.mix.split(","))
    except ValueError:
        mix = ()
    if len(mix) != 3 or min(mix) < 0 or sum(mix) <= 0:
        raise _Usage(f"argument --mix: expected three shares such as 0.4,0.4,0.2, got {args.mix!r}")
    names = (
        "conversations",
        "first_prompt",
        "rounds",
        "user",
        "answer",
        "system",
        "documents",
        "document",
        "question",
        "unique_prompt",
        "output",
        "zipf",
    )
    spec = SynthSpec(
        kind=args.kind,
        requests=args.requests,
        chunk_tokens=args.chunk_tokens,
        rate=args.rate,
        seed=args.seed,
        mix=mix,
        **{n: getattr(args, n) for n in names},
    )
    if spec.conversations < 1 or spec.documents < 1:
        raise _Usage("--conversations and --documents must be at least 1")
    try:
        with open(args.out, "wb") as out:
            count = write(spec, out)
    except OSError as exc:
        raise _Usage(f"--out {args.out}: {exc.strerror or exc}") from None
    print(f"wrote {count:,} {spec.kind} requests to {args.out}")
    return 0


def _from_events(args: argparse.Namespace) -> int:
    from kvtier.plan.events import convert

    medium = None if args.medium == "any" else args.medium
    try:
        with open(args.capture, "rb") as capture, open(args.out, "w") as out:
            converter = convert(capture, out, medium, args.merge_within)
    except OSError as exc:
        raise _Usage(f"{exc.filename}: {exc.strerror or exc}") from None
    skipped = sum(converter.skipped.values())
    print(
        f"wrote {len(converter.requests):,} requests to {args.out}"
        + (f" ({skipped:,} skipped: {dict(converter.skipped)})" if skipped else "")
    )
    return 0
