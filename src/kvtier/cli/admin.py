"""``kvtier admin``: switch a running server's tiers off and on through its admin endpoint.

The endpoint is the one ``metrics_admin`` serves beside ``/metrics`` (kvtier's manager, or a
vLLM engine's kvtier runtime)::

    kvtier admin --url http://127.0.0.1:9100 tiers
    kvtier admin --url http://127.0.0.1:9100 disable fs --reason maintenance
    kvtier admin --url http://127.0.0.1:9100 enable fs

Each prints the endpoint's JSON answer on one line. A refusal (no such tier, 403, 503) prints
``kvtier: error: ...`` with the endpoint's reason and exits 1; an endpoint that does not answer
within ``--timeout`` seconds exits 1 too. Bad input is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from kvtier.cli.common import float_in, one_line
from kvtier.control.tier_switches import MAX_REASON, is_reason

#: Answers larger than this are not an admin endpoint's.
MAX_ANSWER = 1 << 20


def base_url(text: str) -> str:
    """An argparse type: ``http://host:port`` (a path, if any, is dropped)."""
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        parts = urllib.parse.urlsplit("")
    if parts.scheme != "http" or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected http://HOST:PORT, got {text!r}")
    return f"http://{parts.netloc}"


def reason(text: str) -> str:
    """An argparse type: a switch's reason, 1 to ``MAX_REASON`` printable characters."""
    if not is_reason(text):
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_REASON} printable characters")
    return text


def add_admin_command(commands: Any) -> None:
    admin = commands.add_parser(
        "admin", help="switch a running server's tiers off and on (its admin endpoint)"
    )
    admin.add_argument(
        "--url",
        required=True,
        type=base_url,
        help="the metrics endpoint, http://127.0.0.1:PORT (metrics_port)",
    )
    admin.add_argument(
        "--timeout",
        type=float_in(0, 600),
        default=10.0,
        metavar="SECONDS",
        help="seconds to wait for an answer, at most 600 (default: 10)",
    )
    sub = admin.add_subparsers(dest="admin_command", required=True)
    tiers = sub.add_parser("tiers", help="list the enabled and the switched-off tiers")
    disable = sub.add_parser("disable", help="switch tier NAME off until enabled again")
    disable.add_argument("name", help="the tier's name, as `tiers` lists it")
    disable.add_argument(
        "--reason",
        type=reason,
        default="manual",
        help=f"why, 1 to {MAX_REASON} characters (a metric label; default: manual)",
    )
    enable = sub.add_parser("enable", help="switch tier NAME back on")
    enable.add_argument("name", help="the tier's name, as `tiers` lists it")
    admin.set_defaults(handler=run_admin, command_parser=admin)
    for parser in (tiers, disable, enable):  # bad input shows the usage it was given to
        parser.set_defaults(command_parser=parser)


def run_admin(args: argparse.Namespace) -> int:
    """Send the request ``args`` describe; print the answer; 0, or 1 when refused."""
    try:
        with urllib.request.urlopen(_request(args), timeout=args.timeout) as answer:
            print(json.dumps(_body(answer.read(MAX_ANSWER))))
        return 0
    except urllib.error.HTTPError as exc:
        print(f"kvtier: error: {exc.code} {one_line(str(_refusal(exc)))}", file=sys.stderr)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        cause = getattr(exc, "reason", exc)
        print(f"kvtier: error: no answer from {args.url}: {one_line(str(cause))}", file=sys.stderr)
    return 1


def _request(args: argparse.Namespace) -> urllib.request.Request:
    if args.admin_command == "tiers":
        return urllib.request.Request(f"{args.url}/admin/tiers")
    name, action = urllib.parse.quote(args.name, safe=""), args.admin_command
    query = f"?reason={urllib.parse.quote(args.reason)}" if action == "disable" else ""
    url = f"{args.url}/admin/tiers/{name}/{action}{query}"
    return urllib.request.Request(url, data=b"", method="POST")


def _refusal(exc: urllib.error.HTTPError) -> Any:
    """Why the endpoint refused: its JSON ``error``, else the HTTP reason (a proxy's or another
    server's error page is not JSON)."""
    try:
        return _body(exc.read(MAX_ANSWER)).get("error", exc.reason)
    except (ValueError, OSError):
        return exc.reason


def _body(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: JSON nested too deep
        raise ValueError("not an admin endpoint's answer (not JSON)") from None
    if not isinstance(body, dict):
        raise ValueError("not an admin endpoint's answer")
    return body
