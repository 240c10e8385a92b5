"""``kvtier trace synth`` and ``kvtier trace from-events``: write request traces.

Runs on the main thread; bad input exits with status 2 and a one-line error.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvtier.cli_types import float_in, int_in
from kvtier.plan.cli_common import Usage, command


def add_trace_commands(commands: Any) -> None:
    """Register ``kvtier trace synth`` and ``kvtier trace from-events``."""
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
    synth.set_defaults(handler=command(_synth), plan_parser=synth)
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
    events.set_defaults(handler=command(_from_events), plan_parser=events)


def _synth(args: argparse.Namespace) -> int:
    from kvtier.plan.synth import SynthSpec, write

    try:
        mix = tuple(float(x) for x in args.mix.split(","))
    except ValueError:
        mix = ()
    if len(mix) != 3 or min(mix) < 0 or sum(mix) <= 0:
        raise Usage(f"argument --mix: expected three shares such as 0.4,0.4,0.2, got {args.mix!r}")
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
        raise Usage("--conversations and --documents must be at least 1")
    try:
        with open(args.out, "wb") as out:
            count = write(spec, out)
    except OSError as exc:
        raise Usage(f"--out {args.out}: {exc.strerror or exc}") from None
    print(f"wrote {count:,} {spec.kind} requests to {args.out}")
    return 0


def _from_events(args: argparse.Namespace) -> int:
    from kvtier.plan.events import convert

    medium = None if args.medium == "any" else args.medium
    try:
        with open(args.capture, "rb") as capture, open(args.out, "w") as out:
            converter = convert(capture, out, medium, args.merge_within)
    except OSError as exc:
        raise Usage(f"{exc.filename}: {exc.strerror or exc}") from None
    skipped = sum(converter.skipped.values())
    print(
        f"wrote {len(converter.requests):,} requests to {args.out}"
        + (f" ({skipped:,} skipped: {dict(converter.skipped)})" if skipped else "")
    )
    return 0
