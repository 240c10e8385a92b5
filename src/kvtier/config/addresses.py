"""Checks of network addresses in configuration values: host names, ZeroMQ endpoints, HTTP
URLs, whether an address is loopback, and URLs with their credentials hidden for messages.

Marks for ``typing.Annotated`` fields as in ``checks`` (``HostName``, ``BindHost``,
``Endpoint()``, ``HttpUrl()``); nothing here touches the network: a host name is checked for
its syntax, not resolved.

Thread safety: plain values and functions.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from kvtier.config.checks import Text
from kvtier.errors import ConfigError

_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_URL_USER = re.compile(r"(\b[a-zA-Z][\w+.-]*://)[^/\s@]*@")


@dataclass(frozen=True)
class Host:
    """An IP address or a host name (RFC 1123), not resolved; ``*`` (every interface) if ``any``."""

    any: bool = False

    def check(self, value: Any, path: str) -> None:
        Text().check(value, path)
        if not (self.any and value == "*") and not is_host(value):
            raise ConfigError(f"{path}: expected an IP address or a host name, got {value!r}")


@dataclass(frozen=True)
class Endpoint:
    """A ZeroMQ endpoint ``tcp://HOST:PORT`` (IPv6 in brackets) or ``ipc://PATH``.

    ``bind``: the host may be ``*`` (every interface).
    """

    bind: bool = True

    def check(self, value: Any, path: str) -> None:
        Text().check(value, path)
        problem = endpoint_problem(value, self.bind)
        if problem:
            raise ConfigError(f"{path}: {problem}, got {value!r}")


@dataclass(frozen=True)
class HttpUrl:
    """An ``http://`` or ``https://`` URL with a valid host and port, and no whitespace or
    control character anywhere (``urlsplit`` would drop some, the client would not);
    credentials are redacted."""

    def check(self, value: Any, path: str) -> None:
        Text().check(value, path)
        if not _is_http_url(value):
            said = "a value with '@' (not shown)" if "@" in value else repr(redact_url(value))
            raise ConfigError(f"{path}: expected a URL such as http://minio:9000, got {said}")


def _is_http_url(text: str) -> bool:
    if not text.isprintable() or any(c.isspace() for c in text):
        return False
    try:
        url = urlsplit(text)
        port_ok = url.port is None or url.port > 0
    except ValueError:  # a bad port or a broken IPv6 address
        return False
    host_ok = url.hostname is not None and is_host(url.hostname)
    return url.scheme in ("http", "https") and host_ok and port_ok


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP, ``[v6]``, ``v6%zone`` or ``localhost``) is this machine only;
    a name other than ``localhost`` or a wildcard is taken as reachable from elsewhere."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return False


def is_host(text: str) -> bool:
    """An IPv4 or IPv6 address, or an RFC 1123 host name whose last label is not all digits
    (so ``999.1.1.1``, a broken IPv4 address, is not taken for a name)."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    name = text[:-1] if text.endswith(".") else text
    labels = name.split(".")
    if len(name) > 253 or re.fullmatch(r"[0-9]+", labels[-1]):
        return False
    return all(_LABEL.fullmatch(label) for label in labels)


def endpoint_problem(endpoint: str, bind: bool) -> str | None:
    """What is wrong with a ZeroMQ endpoint, or ``None``."""
    scheme, sep, rest = endpoint.partition("://")
    if sep and scheme == "ipc" and rest:
        return None
    if not sep or scheme != "tcp":
        return "expected tcp://HOST:PORT (or ipc://PATH)"
    host, colon, port = rest.rpartition(":")
    if not colon or not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
        return "expected tcp://HOST:PORT with a port from 1 to 65535"
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1] if ":" in host else ""
    elif ":" in host:
        host = ""  # an IPv6 address must be in brackets
    if (bind and host == "*") or is_host(host):
        return None
    where = "an IP address, a host name or *" if bind else "an IP address or a host name"
    return f"expected tcp://HOST:PORT with HOST {where}"


def redact_url(text: str) -> str:
    """``text`` with any user:password of a URL shown as ``***`` and its query hidden."""
    if "://" not in text:
        return text
    try:
        url = urlsplit(text)
        host = url.netloc.rpartition("@")[2]
    except ValueError:
        return "<unparseable URL>"
    if "@" in url.netloc:
        url = url._replace(netloc=f"***@{host}")
    if url.query:
        url = url._replace(query="***")
    return url.geturl()


def redact_urls(text: str) -> str:
    """``text`` with the user:password of every URL in it shown as ``***``."""
    return _URL_USER.sub(r"\1***@", text)


HostName = Annotated[str, Host()]
BindHost = Annotated[str, Host(any=True)]
