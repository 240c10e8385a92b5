"""The ``kvtier`` command line: ``kvtier config check FILE`` and friends."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

from kvtier.config import ExternalTierConfig, TierConfig, TieringConfig
from kvtier.errors import KVTierError
from kvtier.layout import DTYPE_SIZES, KVLayout
from kvtier.plan.cli import add_plan_commands
from kvtier.region import ALIGNMENT, round_up


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


def describe_tier(tier: TierConfig) -> str:
    """One line per tier; fields marked ``repr=False`` (credentials) are never shown."""
    if isinstance(tier, ExternalTierConfig):
        return f"{tier.module_path}.{tier.class_name} options={sorted(tier.options)}"
    shown = [f for f in dataclasses.fields(tier) if f.repr and f.name != "name"]
    parts = [f"{f.name}={_short(getattr(tier, f.name))}" for f in shown]
    return f"{tier.type_name:<6} " + " ".join(parts)


def _short(value: Any) -> str:
    if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
        return ",".join(f"{v.host}:{v.port}" for v in value)
    if dataclasses.is_dataclass(value):
        return f"[{describe_tier(value)}]"  # type: ignore[arg-type]
    return str(value)


def describe_config(config: TieringConfig, layout: KVLayout) -> str:
    stride = round_up(layout.chunk_bytes, ALIGNMENT)
    num_slots = config.host_slots(layout.chunk_bytes)
    lines = []
    if config.kv_connector:
        lines.append(f"connector:       {config.kv_connector} ({config.kv_role or 'no role'})")
    lines += [
        f"spec:            {config.spec_name}",
        f"layout:          {layout.num_layers} layers x {layout.num_kv_heads} KV heads x "
        f"{layout.head_dim} head dim, {layout.dtype}",
        f"chunk:           {layout.blocks_per_chunk} blocks x {layout.block_size} tokens = "
        f"{layout.tokens_per_chunk} tokens, {human_bytes(layout.chunk_bytes)} per slot",
        f"host tier:       {num_slots} slots ({human_bytes(num_slots * stride)} of "
        f"{human_bytes(config.cpu_bytes_to_use)}), eviction {config.eviction_policy}",
        "secondary tiers: " + ("none" if not config.secondary_tiers else "(lookup order)"),
    ]
    lines += [f"  {i}. {describe_tier(t)}" for i, t in enumerate(config.secondary_tiers, 1)]
    return "\n".join(lines)


def _config_check(args: argparse.Namespace) -> int:
    try:
        config = TieringConfig.load(args.file)
        blocks = config.blocks_per_chunk_for(args.engine_block_size) or args.blocks_per_chunk
        layout = KVLayout(
            num_layers=args.num_layers,
            num_kv_heads=args.num_kv_heads,
            head_dim=args.head_dim,
            dtype=args.dtype,
            block_size=args.engine_block_size,
            blocks_per_chunk=blocks,
        )
        print(describe_config(config, layout))
    except KVTierError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _add_config_commands(commands: Any) -> None:
    config = commands.add_parser("config", help="inspect a configuration file")
    sub = config.add_subparsers(dest="config_command", required=True)
    check = sub.add_parser("check", help="validate FILE and print the resolved configuration")
    check.add_argument("file", help="JSON: a vLLM --kv-transfer-config or its extra config")
    shape = check.add_argument_group("model shape (for slot sizes; defaults: a Llama-3-8B)")
    shape.add_argument("--num-layers", type=int, default=32)
    shape.add_argument("--num-kv-heads", type=int, default=8)
    shape.add_argument("--head-dim", type=int, default=128)
    shape.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_SIZES))
    shape.add_argument("--engine-block-size", type=int, default=16)
    shape.add_argument("--blocks-per-chunk", type=int, default=16, help="when the config is silent")
    check.set_defaults(handler=_config_check)


def _events(args: argparse.Namespace) -> int:
    from kvtier.events import EventSubscriber, describe_wire

    expected, subscriber = None, EventSubscriber(args.connect, args.topic)
    try:
        for seq, _, events in subscriber.batches(args.timeout):
            if expected is not None and seq != expected:
                print(f"! missed batches {expected}..{seq - 1}", flush=True)
            expected = seq + 1
            for event in events:
                print(describe_wire(event), flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        subscriber.close()
    return 0


def _add_events_command(commands: Any) -> None:
    events = commands.add_parser("events", help="print KV events as they arrive")
    events.add_argument("--connect", required=True, help="publisher endpoint, tcp://host:port")
    events.add_argument("--topic", default="", help="topic prefix to subscribe to")
    events.add_argument("--timeout", type=float, default=None,
                        help="stop after this many seconds without an event")  # fmt: skip
    events.set_defaults(handler=_events)


def _add_bench_command(commands: Any) -> None:
    from kvtier.bench import cli as bench_cli

    bench = commands.add_parser(
        "bench",
        help="the multi-turn benchmark: when tiering beats recompute, and by how much",
        description="Sweep conversations x strategies (recompute, host, host + tiers, ceiling); "
        "print a table, write JSON and a PNG chart.",
    )
    bench_cli.add_arguments(bench)
    bench.set_defaults(handler=bench_cli.run)


def _peer_keygen(args: argparse.Namespace) -> int:
    from kvtier.tiers.transport import write_keypair  # lazy: pyzmq is optional

    try:
        public, secret = write_keypair(args.out, args.name)
    except FileExistsError as exc:
        print(f"error: {exc.filename} exists; not overwriting a key", file=sys.stderr)
        return 2
    print(f"public key: {public}\nsecret key: {secret} (mode 0600; keep it private)")
    return 0


def _add_peer_commands(commands: Any) -> None:
    peer = commands.add_parser("peer", help="peer-to-peer tier tools")
    sub = peer.add_subparsers(dest="peer_command", required=True)
    keygen = sub.add_parser("keygen", help="write a CURVE key pair (NAME.public, NAME.secret)")
    keygen.add_argument("--out", required=True, help="directory for the key files")
    keygen.add_argument("--name", default="kvtier", help="file name stem (default: kvtier)")
    keygen.set_defaults(handler=_peer_keygen)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvtier", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_config_commands(commands)
    _add_events_command(commands)
    _add_bench_command(commands)
    _add_peer_commands(commands)
    add_plan_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
