"""``kvtier trace synth`` and ``kvtier trace from-events``: write request traces.

Bad input exits with status 2 and a one-line error, never a traceback. The trace is written to
a temporary file renamed into place at the end (``cli_files.atomic_output``): a failed command
leaves no file. A capture must be a regular file (a FIFO or a device would block or never end);
``from-events`` holds its memory within ``--memory-budget`` and its output within
``--max-output-bytes``. Runs on the main thread.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from kvtier.cli.common import float_in, int_in
from kvtier.cli.files import atomic_output, open_input
from kvtier.plan.budget import text_of
from kvtier.plan.cli_common import Usage, add_memory_budget, byte_size, command, out_of_memory

#: Synth options of a size in tokens, or a count: (flag, group, default, help).
_SIZES = (
    ("system", "shared", 512, "system prompt every chat and rag request starts with"),
    ("conversations", "chat", 16, "conversations served side by side (one wave)"),
    ("first-prompt", "chat", 768, "first prompt of a conversation, after the system prompt"),
    ("rounds", "chat", 4, "turns of a conversation after the first"),
    ("user", "chat", 32, "user message each later turn appends"),
    ("answer", "chat", 2, "model answer each later turn appends (the previous turn's output)"),
    ("documents", "rag", 1000, "distinct documents, popularity by --zipf"),
    ("document", "rag", 2048, "tokens of one document"),
    ("question", "rag", 64, "question after the document, unique to each request"),
    ("unique-prompt", "unique", 1024, "mean prompt (each one +-50%%), shared with no other"),
)
_COUNTS = {"conversations": (1, 1 << 20), "rounds": (0, 1 << 16), "documents": (1, 1 << 30)}
_TOKENS = (0, 1 << 24)


def add_trace_commands(commands: Any) -> None:
    """Register ``kvtier trace synth`` and ``kvtier trace from-events``."""
    trace = commands.add_parser("trace", help="make request traces for kvtier plan")
    sub = trace.add_subparsers(dest="trace_command", required=True)
    _add_synth(sub)
    _add_from_events(sub)


def _add_synth(sub: Any) -> None:
    synth = sub.add_parser(
        "synth",
        help="write a synthetic workload's trace",
        description="Write the trace of a synthetic workload (JSONL, one request a line) for "
        "kvtier plan. Sizes are in tokens. Requests arrive as a Poisson process.",
    )
    synth.add_argument(
        "--kind",
        choices=("chat", "rag", "unique", "mix"),
        default="mix",
        help="chat: multi-turn conversations; rag: a shared system prompt, a "
        "popular document and a question; unique: prompts that share nothing; "
        "mix: each request one of the three, in --mix shares",
    )
    synth.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="trace file to write (written whole, or not at all)",
    )
    synth.add_argument(
        "--requests",
        type=int_in(1, 1 << 40),
        default=10_000,
        metavar="N",
        help="requests in the trace",
    )
    synth.add_argument(
        "--chunk-tokens",
        type=int_in(1, 1 << 20),
        default=64,
        metavar="TOKENS",
        help="tokens per chunk key (kvtier plan can coarsen it to multiples)",
    )
    synth.add_argument(
        "--rate",
        type=float_in(0, 1e9),
        default=20.0,
        metavar="PER_S",
        help="mean arrival rate, requests per second",
    )
    synth.add_argument(
        "--seed",
        type=int_in(0, (1 << 64) - 2),
        default=0,
        help="random seed, 0 to 2**64-2 (same seed, same trace)",
    )
    synth.add_argument(
        "--output",
        type=int_in(*_TOKENS),
        default=128,
        metavar="TOKENS",
        help="tokens generated per request (recorded; a chat's next turn appends --answer)",
    )
    synth.add_argument(
        "--mix",
        default="0.4,0.4,0.2",
        metavar="CHAT,RAG,UNIQUE",
        help="shares of the three kinds with --kind mix",
    )
    groups = {
        name: synth.add_argument_group(f"{name} workload sizes")
        for name in ("shared", "chat", "rag", "unique")
    }
    for name, group, default, text in _SIZES:
        low, high = _COUNTS.get(name, _TOKENS)
        metavar = "N" if name in _COUNTS else "TOKENS"
        groups[group].add_argument(
            f"--{name}",
            type=int_in(low, high),
            default=default,
            metavar=metavar,
            help=f"{text}; {low} to {high}",
        )
    groups["rag"].add_argument(
        "--zipf",
        type=float_in(1, 100),
        default=1.1,
        metavar="EXPONENT",
        help="Zipf exponent of document popularity, above 1 (higher: "
        "fewer documents take most requests)",
    )
    synth.set_defaults(
        handler=command(_synth, out_of_memory="lower --requests"),
        plan_parser=synth,
        command_parser=synth,
    )


def _add_from_events(sub: Any) -> None:
    events = sub.add_parser(
        "from-events",
        help="convert a capture of vLLM-format KV events",
        description="Convert a capture of KV events (vLLM's format: concatenated msgpack "
        "KVEventBatch payloads) into a trace for kvtier plan: each stored block chain of the "
        "chosen medium becomes a request.",
    )
    events.add_argument("capture", help="capture file: concatenated msgpack KVEventBatch payloads")
    events.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="trace file to write (written whole, or not at all)",
    )
    events.add_argument(
        "--medium",
        default="GPU",
        help="medium of the stores to read: GPU (what the engine computed), "
        "CPU, STORAGE..., or any",
    )
    events.add_argument(
        "--merge-within",
        type=float_in(0, 86_400, low_ok=True),
        default=1.0,
        metavar="SECONDS",
        help="a store this soon after the one it extends continues that request, 0 to 86400 s",
    )
    add_memory_budget(events, "the conversion")
    events.add_argument(
        "--max-output-bytes",
        type=byte_size,
        default="1GiB",
        metavar="BYTES",
        help="the largest trace to write; beyond it the command stops with an error (default "
        "1GiB: a larger trace needs a --memory-budget over 8GiB to plan)",
    )
    events.set_defaults(
        handler=command(_from_events, out_of_memory=out_of_memory("the conversion")),
        plan_parser=events,
        command_parser=events,
    )


def _synth(args: argparse.Namespace) -> int:
    from kvtier.plan.synth import SynthSpec, size_problem, write

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
        mix=_mix(args.mix),
        **{n: getattr(args, n) for n in names},
    )
    problem = size_problem(spec)
    if problem:
        raise Usage(problem)
    with atomic_output(args.out, "--out", binary=True) as out:
        count = write(spec, out)
    print(f"wrote {count:,} {spec.kind} requests to {args.out}")
    return 0


def _mix(text: str) -> tuple[float, float, float]:
    """``--mix``: three finite, non-negative shares, not all zero."""
    try:
        shares = tuple(float(x) for x in text.split(","))
    except ValueError:
        shares = ()
    finite = all(math.isfinite(x) and x >= 0 for x in shares) and math.isfinite(sum(shares))
    if len(shares) != 3 or not finite or sum(shares) <= 0:
        raise Usage(f"argument --mix: expected three shares such as 0.4,0.4,0.2, got {text!r}")
    return shares[0], shares[1], shares[2]


def _from_events(args: argparse.Namespace) -> int:
    from kvtier.plan.trace_from_events import convert

    medium = None if args.medium == "any" else args.medium
    limits = (args.memory_budget, args.max_output_bytes)
    with open_input(args.capture, "capture") as capture, atomic_output(args.out, "--out") as out:
        converter = convert(capture, out, medium, args.merge_within, *limits)
    output, skipped = converter.output, converter.skipped
    reasons = "; ".join(f"{n:,} {reason}" for reason, n in skipped.most_common())
    forgotten = f"; {converter.forgotten:,} block links forgotten within {limits[0]}"
    print(
        f"wrote {output.requests:,} requests ({text_of(output.written)}) to {args.out}"
        + (f" ({skipped.total():,} skipped: {reasons})" if skipped else "")
        + (forgotten if converter.forgotten else "")
    )
    return 0
