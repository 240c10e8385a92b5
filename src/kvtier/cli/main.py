"""The ``kvtier`` command line: ``kvtier config check FILE`` and friends.

Bad input is answered the way argparse answers it: the command's usage line, then
``kvtier: error: ...`` on stderr and exit status 2, never a traceback. A handler reports such
input by raising ``UsageError`` (``kvtier.cli.common``). ``DESCRIPTION`` and ``EPILOG`` are what
``kvtier --help`` shows; ``kvtier --version`` prints ``version_text()``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from kvtier.cli.about import missing_package, version_text
from kvtier.cli.admin import add_admin_command
from kvtier.cli.cache import add_cache_commands
from kvtier.cli.common import CliFormatter, UsageError, add_model_shape, float_in, int_in, one_line
from kvtier.config.addresses import endpoint_problem
from kvtier.config.describe import config_warnings, describe_config
from kvtier.config.schema import TieringConfig
from kvtier.errors import KVTierError
from kvtier.layout import KVLayout
from kvtier.plan.cli import add_plan_commands

__all__ = ["UsageError", "build_parser", "main", "version_text"]

DESCRIPTION = """\
kvtier keeps the KV cache of LLM serving engines (vLLM, SGLang, transformers) alive after the
accelerator lets go of it: in host memory, then in files, object storage or peer instances, from
where a later request with the same prefix loads it instead of recomputing it. These commands
check a configuration, size tiering for a workload, measure it on this machine, and watch or
steer a running server."""

EPILOG = """\
examples:
  kvtier config check kv.json              what a configuration sets up (kvtier's or vLLM's)
  kvtier trace synth --out trace.jsonl     a synthetic request trace to try plan on
  kvtier plan trace.jsonl                  should I tier, and how big? (prints vLLM's flag)
  kvtier bench --quick                     tiering against recompute here, in under a minute
  kvtier events --connect tcp://127.0.0.1:5557 --timeout 30
  kvtier admin --url http://127.0.0.1:9100 tiers
  kvtier peer keygen --out keys --name server
  kvtier cache ls /mnt/kv-cache             what a shared cache holds (also du, verify, gc)

`kvtier COMMAND --help` lists a command's options. The manual is in kvtier's repository:
docs/configuration.md, docs/operating.md, docs/security.md, and docs/README.md for the rest."""


class CliParser(argparse.ArgumentParser):
    """``error`` prints this (sub)command's usage and ``kvtier: error: MESSAGE``; exits 2.

    Help texts say each option's default (``CliFormatter``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", CliFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"kvtier: error: {one_line(message)}\n")


def _config_check(args: argparse.Namespace) -> int:
    """kvtier's own configuration, or (``--as vllm``, or detected) vLLM's kv-transfer-config."""
    from kvtier.config.parser import load_json, read_config_file
    from kvtier.integrations.vllm.check import is_vllm_json

    try:
        data = load_json(read_config_file(args.file))
        if args.read_as == "vllm" or (args.read_as == "auto" and is_vllm_json(data)):
            return _config_check_vllm(args, data)
        config = TieringConfig.from_dict(data)
        block = args.engine_block_size or 16
        blocks = config.blocks_per_chunk_for(block) or args.blocks_per_chunk or 16
        layout = KVLayout(
            num_layers=args.num_layers,
            num_kv_heads=args.num_kv_heads,
            head_dim=args.head_dim,
            dtype=args.dtype,
            block_size=block,
            blocks_per_chunk=blocks,
        )
        print(describe_config(config, layout))
    except KVTierError as exc:
        raise UsageError(str(exc)) from None
    _warn(config_warnings(config))
    return 0


def _config_check_vllm(args: argparse.Namespace, data: Any) -> int:
    """What vLLM will build from ``data``; ``KVTierError`` where it would not start."""
    from kvtier.config.parser import check_depth
    from kvtier.integrations.vllm.check import ENGINE_BLOCK, Shape, check_vllm, installed_target

    if args.blocks_per_chunk is not None:
        raise UsageError(
            "--blocks-per-chunk: vLLM takes the chunk from the JSON only "
            "(blocks_per_chunk or block_size; 1 engine block by default)"
        )
    check_depth(data)
    target, why = (args.target, "--target") if args.target else installed_target()
    block = args.engine_block_size or ENGINE_BLOCK[target]
    shape = Shape(args.num_layers, args.num_kv_heads, args.head_dim, args.dtype, block)
    report = check_vllm(data, target, shape, "" if args.target else why)
    print("\n".join([f"vLLM target:     {target} ({why})", *report.lines]))
    _warn(report.warnings)
    return 0


def _warn(warnings: Iterable[str]) -> None:
    for warning in warnings:
        print(f"kvtier: warning: {warning}", file=sys.stderr)


def _add_config_commands(commands: Any) -> None:
    config = commands.add_parser("config", help="inspect a configuration file")
    sub = config.add_subparsers(dest="config_command", required=True)
    check = sub.add_parser("check", help="validate FILE and print the resolved configuration")
    check.add_argument(
        "file",
        help="configuration file (JSON): kvtier's own, or vLLM's "
        "--kv-transfer-config or its kv_connector_extra_config",
    )
    check.add_argument(
        "--as",
        dest="read_as",
        choices=("auto", "vllm", "kvtier"),
        default="auto",
        help="read FILE as vLLM reads it, or as kvtier's own "
        "configuration (auto: vLLM's when it has kv_connector, spec_name or a "
        "Kvtier* tier)",
    )
    check.add_argument(
        "--target",
        choices=("vllm-cpu", "vllm-cuda"),
        help="the vLLM build (vLLM JSON; default: the installed one)",
    )
    title = "model shape (sizes a chunk, so the slots host memory holds; defaults: Llama-3-8B)"
    _add_shape_arguments(check.add_argument_group(title))
    check.set_defaults(handler=_config_check, command_parser=check)


def _add_shape_arguments(shape: Any) -> None:
    add_model_shape(shape)
    size = int_in(1, 1 << 16)
    shape.add_argument(
        "--engine-block-size",
        type=size,
        default=None,
        metavar="TOKENS",
        help="tokens per engine block (default 16; under vLLM: 128 on vllm-cpu, 16 on vllm-cuda)",
    )
    shape.add_argument(
        "--blocks-per-chunk",
        type=size,
        default=None,
        metavar="N",
        help="engine blocks per kvtier chunk when a kvtier config does not say "
        "(default 16; not for vLLM JSON)",
    )


def _endpoint(text: str) -> str:
    problem = endpoint_problem(text, bind=False)
    if problem:
        raise argparse.ArgumentTypeError(f"{problem}, got {text!r}")
    return text


def _events(args: argparse.Namespace) -> int:
    from kvtier.cli.events import follow

    return follow(args.connect, args.topic, args.timeout)


def _add_events_command(commands: Any) -> None:
    events = commands.add_parser(
        "events",
        help="print KV events as they arrive",
        description="Subscribe to a KV event publisher (kvtier's kv_events, or vLLM's own) and "
        "print one line per event. Exit status 1 when no publisher answers within --timeout.",
    )
    events.add_argument(
        "--connect",
        required=True,
        type=_endpoint,
        metavar="ENDPOINT",
        help="publisher endpoint, tcp://HOST:PORT",
    )
    events.add_argument(
        "--topic", default="", help="topic prefix to subscribe to (default: every topic)"
    )
    events.add_argument(
        "--timeout",
        type=float_in(0, 86_400),
        default=None,
        metavar="SECONDS",
        help="stop after this many seconds without an event; exit 1 if no "
        "publisher answers within it (default: wait for ever)",
    )
    events.set_defaults(handler=_events, command_parser=events)


def _add_bench_command(commands: Any) -> None:
    from kvtier.bench import cli as bench_cli

    bench = commands.add_parser(
        "bench",
        help="the multi-turn benchmark: when tiering beats recompute, and by how much",
        description="Sweep conversations x strategies (recompute, host, host + tiers, ceiling); "
        "print a table, write JSON and a PNG chart.",
    )
    bench_cli.add_arguments(bench)
    bench.set_defaults(handler=bench_cli.run, command_parser=bench)


_KEY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


def _key_name(text: str) -> str:
    """An argparse type: a key file's name stem (a file name, not a path)."""
    if not _KEY_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            "expected 1 to 128 letters, digits, '.', '_' or '-', not starting with '.' or '-' "
            f"(a file name, not a path), got {text!r}"
        )
    return text


def _peer_keygen(args: argparse.Namespace) -> int:
    from kvtier.tiers.peer.curve_keys import write_keypair  # lazy: pyzmq is optional

    try:
        public, secret = write_keypair(args.out, args.name)
    except FileExistsError as exc:
        raise UsageError(f"argument --name: {exc.filename} exists; not overwriting a key") from None
    except NotADirectoryError:
        raise UsageError(f"argument --out: {args.out} is not a directory") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = getattr(exc, "strerror", None) or exc
        raise UsageError(f"argument --out: cannot write keys in {args.out} ({reason})") from None
    print(f"public key: {public}\nsecret key: {secret} (mode 0600; keep it private)")
    return 0


def _add_peer_commands(commands: Any) -> None:
    peer = commands.add_parser("peer", help="peer-to-peer tier tools")
    sub = peer.add_subparsers(dest="peer_command", required=True)
    keygen = sub.add_parser(
        "keygen",
        help="write a CURVE key pair (NAME.public, NAME.secret)",
        description="Write a CURVE key pair for the peer tier: OUT/NAME.public (give it to the "
        "other side) and OUT/NAME.secret (mode 0600). OUT is made (mode 0700) if missing; an "
        "existing key is never overwritten.",
    )
    keygen.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="directory for the key files (made, mode 0700, if missing)",
    )
    keygen.add_argument(
        "--name", default="kvtier", type=_key_name, help="file name stem of the two key files"
    )
    keygen.set_defaults(handler=_peer_keygen, command_parser=keygen)


class _VersionAction(argparse.Action):
    """``--version``: print ``version_text()`` and exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version_text())
        parser.exit(0)


class _TopFormatter(argparse.RawDescriptionHelpFormatter, CliFormatter):
    """``kvtier --help``: the description and examples as written."""


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="kvtier", description=DESCRIPTION, epilog=EPILOG, formatter_class=_TopFormatter
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the versions of kvtier and of the engines installed (vLLM, "
        "SGLang, torch), and exit",
    )
    commands = parser.add_subparsers(
        title="commands", dest="command", required=True, metavar="COMMAND"
    )
    _add_config_commands(commands)
    _add_events_command(commands)
    _add_bench_command(commands)
    _add_peer_commands(commands)
    add_admin_command(commands)
    add_plan_commands(commands)
    add_cache_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status. Bad input exits with status 2 (``SystemExit``), with
    the usage of the (sub)command it was given to; a missing optional package is exit status 1
    with the extra to install; Ctrl-C is exit status 130 with one line, not a traceback."""
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        code: int = args.handler(args)
    except UsageError as exc:
        args.command_parser.error(str(exc))
    except ModuleNotFoundError as exc:
        message = missing_package(exc, args.command_parser.prog.removeprefix("kvtier "))
        if message is None:
            raise
        print(f"kvtier: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{args.command_parser.prog}: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
