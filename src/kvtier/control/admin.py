"""The admin endpoint: switch tiers off and on over HTTP, beside ``/metrics``.

Off by default (``metrics_admin: true`` turns it on) and loopback-only: the config refuses it on
a metrics address beyond loopback, and every request from a peer that is not loopback gets 403.
A web page open in a local browser is a loopback client too, so requests a browser sends on a
page's behalf are refused as well (403): any with an ``Origin`` or ``Sec-Fetch-Site`` header
(browsers add them to every cross-site request and every POST), and any whose ``Host`` is not
a loopback address or ``localhost`` (a DNS-rebound name). curl, scripts and Prometheus send
neither.

* ``GET /admin/tiers``: ``{"enabled": [...], "disabled": [...]}``;
* ``POST /admin/tiers/<name>/disable[?reason=TEXT]`` and ``POST /admin/tiers/<name>/enable``:
  ``{"tier": name, "enabled": bool, "changed": bool}``; 404 for a tier that does not exist,
  400 for a reason that is not 1 to 64 printable characters (default ``admin``; ``?reason=``
  is empty), 503 once closed.
  ``<name>`` is the tier's name, percent-encoded as UTF-8 (``kvtier admin`` sends these).

Runs on a metrics server thread; the manager's methods take its lock.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from kvtier.config.addresses import is_loopback
from kvtier.errors import ClosedError, InvalidArgumentError, KVTierError

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment


class Controls(Protocol):
    """What the endpoint switches: a ``Runtime``, or a ``TieringManager`` (its runtime's)."""

    def tier_states(self) -> tuple[list[str], list[str]]: ...

    def disable_tier(self, name: str, reason: str = "manual") -> bool: ...

    def enable_tier(self, name: str) -> bool: ...


PREFIX = "/admin/"
_SWITCH = re.compile(r"/admin/tiers/(?P<name>[^/]+)/(?P<action>enable|disable)")


def admin_app(manager: Controls) -> WSGIApplication:
    """The WSGI app answering ``/admin/...`` for ``manager``."""

    def serve(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        status, body = _answer(manager, environ)
        start_response(status, [("Content-Type", "application/json")])
        return [json.dumps(body).encode() + b"\n"]

    return serve


def _answer(manager: Controls, environ: WSGIEnvironment) -> tuple[str, Any]:
    if not is_loopback(str(environ.get("REMOTE_ADDR", ""))):
        return "403 Forbidden", {"error": "the admin endpoint answers loopback clients only"}
    if _from_a_web_page(environ):
        return "403 Forbidden", {"error": "the admin endpoint refuses requests from web pages"}
    path, method = _path(environ), environ.get("REQUEST_METHOD", "")
    if path == "/admin/tiers":
        if method != "GET":
            return "405 Method Not Allowed", {"error": "GET /admin/tiers"}
        enabled, disabled = manager.tier_states()
        return "200 OK", {"enabled": enabled, "disabled": disabled}
    match = _SWITCH.fullmatch(path)  # "$" would also match before a trailing newline
    if match is None:
        return "404 Not Found", {"error": f"no admin path {path}"}
    if method != "POST":
        return "405 Method Not Allowed", {"error": "POST to switch a tier"}
    try:
        reason = _reason(environ)
    except ValueError as exc:  # too many fields
        return "400 Bad Request", {"error": f"query: {exc}"}
    return _switch(manager, match["name"], match["action"] == "enable", reason)


def _from_a_web_page(environ: WSGIEnvironment) -> bool:
    """Whether a browser sent this for a page (cross-site request forgery, DNS rebinding)."""
    if "HTTP_ORIGIN" in environ or environ.get("HTTP_SEC_FETCH_SITE", "none") != "none":
        return True
    host = str(environ.get("HTTP_HOST", "localhost"))
    name = host[1 : host.find("]")] if host.startswith("[") else host.rsplit(":", 1)[0]
    return not is_loopback(name)


def _path(environ: WSGIEnvironment) -> str:
    """The request's path as its UTF-8 (WSGI hands it over decoded as latin-1); a path that
    is not UTF-8 names no tier, so its undecodable bytes are replaced."""
    raw = str(environ.get("PATH_INFO", ""))
    try:
        return raw.encode("latin-1").decode("utf-8", "replace")
    except UnicodeEncodeError:  # not from a WSGI server: already text
        return raw


def _reason(environ: WSGIEnvironment) -> str:
    """The ``reason`` query parameter of a disable (``admin`` when absent)."""
    query_string = str(environ.get("QUERY_STRING", ""))  # ?reason= is an empty reason: 400
    query = urllib.parse.parse_qs(query_string, keep_blank_values=True, max_num_fields=4)
    return query.get("reason", ["admin"])[-1]


def _switch(manager: Controls, name: str, enable: bool, reason: str) -> tuple[str, Any]:
    try:
        changed = manager.enable_tier(name) if enable else manager.disable_tier(name, reason)
    except ClosedError as exc:
        return "503 Service Unavailable", {"error": str(exc)}
    except InvalidArgumentError as exc:
        return "400 Bad Request", {"error": str(exc)}
    except KVTierError as exc:
        return "404 Not Found", {"error": str(exc)}
    return "200 OK", {"tier": name, "enabled": enable, "changed": changed}
