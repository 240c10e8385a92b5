"""``kvtier cache ls|du|verify|gc TARGET``: look after a shared fs directory or S3 prefix.

TARGET is a directory (an fs tier's ``root_dir``), ``s3://BUCKET/PREFIX`` (an obj tier's
bucket and prefix, with ``--endpoint``/``--region``; keys from the environment as the tier
takes them), or ``--config FILE --tier NAME``. The work is ``kvtier.cache``'s; this module
parses arguments and prints. Problems met on the way (foreign entries, unreadable directories,
bad identity.json) are printed to stderr, one line each, then counted; never a traceback.

Exit status: 0; ``verify`` 1 when a chunk was bad or something could not be read; 2 for bad
arguments or a target that cannot be opened. Thread safety: runs on the main thread (``verify``
starts its readers; ``gc --every`` waits for SIGTERM/SIGINT).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from kvtier.cache.duration import parse_duration
from kvtier.cache.inventory import as_json, du_lines, ls_lines, take_inventory
from kvtier.cache.records import Problems
from kvtier.cache.store import MAX_CHUNK_BYTES
from kvtier.cli.cache_run import open_store, report_problems, run_gc, run_verify
from kvtier.cli.common import UsageError, int_in, one_line
from kvtier.errors import KVTierError
from kvtier.tiers.shared.codec import HEADER_BYTES

EPILOG = """\
examples:
  kvtier cache ls /mnt/kv-cache
  kvtier cache du s3://kv-bucket/kvtier --endpoint http://minio:9000
  kvtier cache verify /mnt/kv-cache --jobs 8 --repair
  kvtier cache gc /mnt/kv-cache --max-bytes 500G --every 300
  kvtier cache gc --config kv.json --tier fs --older-than 7d --dry-run

Safe while servers run: gc and --repair unlink exact chunk files (or delete exact chunk
objects); a server then sees a miss. Nothing outside the tier's layout is ever deleted.
Manual: docs/cache.md in kvtier's repository."""


def add_cache_commands(commands: Any) -> None:
    """Register ``kvtier cache`` and its four subcommands on ``commands``."""
    cache = commands.add_parser(
        "cache",
        help="see, verify, bound and clean a shared fs directory or S3 prefix",
        description="Look after a shared cache: what it holds (ls, du), whether it is sound "
        "(verify), and a bound on it (gc). TARGET is an fs tier's root_dir or s3://BUCKET/PREFIX.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = cache.add_subparsers(dest="cache_command", required=True, metavar="COMMAND")
    ls = _command(sub, "ls", "one line per identity: model, layout, chunks, bytes, use")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    du = _command(sub, "du", "sizes per identity and in all, on disk, and unreachable chunks")
    du.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _add_verify(_command(sub, "verify", "read and check every chunk; exit 1 if any is bad"))
    _add_gc(_command(sub, "gc", "delete chunks: bound the whole cache, expire, purge a model"))
    cache.set_defaults(command_parser=cache)


def _command(sub: Any, name: str, text: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=text, description=text)
    parser.add_argument("target", nargs="?", help="a directory, or s3://BUCKET/PREFIX")
    parser.add_argument("--config", metavar="FILE", help="a kvtier configuration ...")
    parser.add_argument("--tier", metavar="NAME", help="... and its tier entry (name or type)")
    parser.add_argument("--endpoint", metavar="URL", help="S3 endpoint (s3:// targets)")
    parser.add_argument("--region", help="S3 region (s3:// targets)")
    parser.set_defaults(handler=HANDLERS[name], command_parser=parser)
    return parser


def _add_verify(verify: argparse.ArgumentParser) -> None:
    verify.add_argument(
        "--jobs", type=int_in(1, 256), default=4, help="chunks read at once (threads)"
    )
    verify.add_argument(
        "--repair", action="store_true", help="remove bad chunks (kvtier chunk files only)"
    )
    verify.add_argument(
        "--max-chunk-bytes",
        type=_chunk_bound,
        default=MAX_CHUNK_BYTES,
        metavar="SIZE",
        help="chunks larger than this are counted too_large, not read (2G)",
    )
    verify.add_argument(
        "--integrity-key-file",
        metavar="FILE",
        help="check sealed chunks' tags (without it they are counted, not verified)",
    )
    verify.add_argument(
        "--progress",
        choices=("auto", "bar", "lines", "none"),
        default="auto",
        help="a bar on a terminal, periodic lines otherwise (auto)",
    )


def _add_gc(gc: argparse.ArgumentParser) -> None:
    gc.add_argument(
        "--max-bytes",
        type=_bytes,
        metavar="N",
        help="bound the whole cache, every identity: least recently used go first, "
        "unreachable chunks before anything (suffixes K, M, G, T: powers of 1024)",
    )
    gc.add_argument(
        "--older-than", type=_duration, metavar="DURATION", help="delete chunks unused this long"
    )
    gc.add_argument(
        "--identity",
        type=_digest_prefix,
        metavar="DIGEST",
        help="purge this identity (a digest prefix)",
    )
    gc.add_argument("--model", metavar="NAME", help="purge every identity of this model")
    gc.add_argument("--dry-run", action="store_true", help="say what would go; delete nothing")
    gc.add_argument(
        "--every",
        type=int_in(1, 86_400 * 30),
        metavar="SECONDS",
        help="run again every SECONDS until SIGTERM or SIGINT (a sidecar)",
    )


def _bytes(text: str) -> int:
    from kvtier.cache.duration import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _chunk_bound(text: str) -> int:
    """``--max-chunk-bytes``: a size of at least one header block (no chunk is smaller)."""
    size = _bytes(text)
    if size < HEADER_BYTES:
        raise argparse.ArgumentTypeError(f"expected at least {HEADER_BYTES} bytes, got {text!r}")
    return size


def _digest_prefix(text: str) -> str:
    """An identity digest or a prefix of it: 1 to 64 hex digits (an empty prefix would match
    every identity)."""
    if not re.fullmatch(r"[0-9a-fA-F]{1,64}", text):
        raise argparse.ArgumentTypeError(f"expected 1 to 64 hex digits of a digest, got {text!r}")
    return text.lower()


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _inventory(args: argparse.Namespace, *, links: bool) -> int:
    store, _ = open_store(args)
    problems = Problems()
    try:
        entries = take_inventory(store, problems, links=links)
    except KVTierError as exc:
        print(f"kvtier: error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if args.json:
        print(json.dumps(as_json(args.target or args.config, entries, problems), indent=1))
    else:
        print("\n".join((du_lines if links else ls_lines)(entries)))
    report_problems(problems)
    return 0


def _ls(args: argparse.Namespace) -> int:
    return _inventory(args, links=False)


def _du(args: argparse.Namespace) -> int:
    return _inventory(args, links=True)


def _verify(args: argparse.Namespace) -> int:
    store, key_file = open_store(args)
    return run_verify(args, store, args.integrity_key_file or key_file)


def _gc(args: argparse.Namespace) -> int:
    if args.max_bytes is None and args.older_than is None and not (args.identity or args.model):
        raise UsageError("say what to delete: --max-bytes, --older-than, --identity or --model")
    store, _ = open_store(args)
    return run_gc(args, store)


HANDLERS = {"ls": _ls, "du": _du, "verify": _verify, "gc": _gc}
