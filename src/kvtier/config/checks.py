"""Static checks of configuration values: number ranges, host names, endpoints and URLs.

A check is attached to a dataclass field with ``typing.Annotated`` (``port: Port``). The parser
applies it to every value it reads (so the error names the key path, e.g. ``serve.port``), and
``check_fields`` applies it again when a config dataclass is built by hand. Every failure is a
``ConfigError`` whose message starts with the key and never repeats a credential.

Nothing here touches the network or the file system: a host name is checked for its syntax, not
resolved. One check also rewrites its value: a ``LocalPath``'s leading ``~`` becomes the home
directory, as in a shell (``check_fields`` stores the expanded path).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ipaddress
import math
import os
import re
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Protocol
from urllib.parse import urlsplit

from kvtier.config.file_modes import parse_mode
from kvtier.errors import ConfigError, shown
from kvtier.policies.priority import MAX_PRIORITY, MIN_PRIORITY

INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1
DAY_S = 86_400.0
MAX_THREADS = 1024
KEY_HEX_DIGITS = 64
GiB = 1 << 30


class Check(Protocol):
    """An ``Annotated`` mark: raises ``ConfigError`` naming ``path`` if ``value`` is bad."""

    def check(self, value: Any, path: str) -> None: ...


@dataclass(frozen=True)
class Bounds:
    """A finite number from ``low`` to ``high`` (``low`` itself excluded when ``open_low``).

    ``integer`` numbers must be ints (never bools); others may be ints or floats.
    """

    low: float
    high: float
    expected: str
    integer: bool = True
    open_low: bool = False

    def check(self, value: Any, path: str) -> None:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or (self.integer and not isinstance(value, int)):
            kind = "an integer" if self.integer else "a number"
            raise ConfigError(f"{path}: expected {kind}, got {_kind(value)} {shown(value, None)}")
        if not self._within(value):
            raise ConfigError(f"{path}: expected {self.expected}, got {shown(value, None)}")

    def _within(self, value: float) -> bool:
        if isinstance(value, int) and abs(value) > INT64_MAX:
            return False  # every integer is below 2**63, where a float is allowed too
        if not self.integer:
            try:
                value = float(value)  # an int past the floats is out of range too
            except OverflowError:
                return False
            if not math.isfinite(value):
                return False
        above = value > self.low if self.open_low else value >= self.low
        return above and value <= self.high


@dataclass(frozen=True)
class Text:
    """A string: non-empty unless ``empty``, never with a NUL character (paths reject those),
    and Unicode text that UTF-8 can encode (no lone surrogate, as a JSON escape ``\\ud800`` can
    write: such a string could be neither printed nor used as a path)."""

    empty: bool = False

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {_kind(value)}")
        if not value and not self.empty:
            raise ConfigError(f"{path}: expected a non-empty string")
        if "\0" in value:
            raise ConfigError(f"{path}: expected a string without NUL characters")
        if not _is_unicode_text(value):
            raise ConfigError(f"{path}: expected Unicode text, got a lone surrogate (U+D800-DFFF)")


def _is_unicode_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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


@dataclass(frozen=True)
class HexKey:
    """A chunk key written as 64 hexadecimal digits."""

    def check(self, value: Any, path: str) -> None:
        Text().check(value, path)
        if len(value) != KEY_HEX_DIGITS or not re.fullmatch(r"[0-9a-fA-F]+", value):
            raise ConfigError(f"{path}: expected a chunk key of 64 hex digits, got {value!r}")


@dataclass(frozen=True)
class OctalMode:
    """A directory mode as a string of octal digits (``"0700"``, ``"0750"``) that leaves the
    owner read, write and search (``kvtier.config.file_modes.parse_mode``)."""

    def check(self, value: Any, path: str) -> None:
        Text().check(value, path)
        if parse_mode(value) is None:
            raise ConfigError(
                f'{path}: expected an octal mode such as "0700" or "0750" that leaves the '
                f"owner rwx, got {value!r}"
            )


@dataclass(frozen=True)
class LocalPath:
    """A file or directory on this machine: a string ``Text`` accepts, whose leading ``~`` or
    ``~user`` is that home directory (``os.path.expanduser``, applied by ``check_fields``, so
    ``"~/kv"`` is never a directory named ``~``). One that cannot be expanded (no such user) is
    refused; ``./~`` names a directory called ``~``."""

    def check(self, value: Any, path: str) -> None:
        Text().check(value, path)
        if expand_path(value).startswith("~"):
            raise ConfigError(
                f"{path}: cannot expand {value!r}: no such user's home directory (write "
                f"./{value} for a path that starts with a directory named {value.split('/')[0]})"
            )


def expand_path(value: str) -> str:
    """``value`` with a leading ``~`` or ``~user`` replaced by that home directory."""
    return os.path.expanduser(value)


Port = Annotated[int, Bounds(1, 65535, "a TCP port from 1 to 65535")]
RetentionPriority = Annotated[
    int, Bounds(MIN_PRIORITY, MAX_PRIORITY, f"an integer from {MIN_PRIORITY} to {MAX_PRIORITY}")
]
Threads = Annotated[int, Bounds(1, MAX_THREADS, f"a positive integer of at most {MAX_THREADS}")]
Count = Annotated[int, Bounds(1, INT64_MAX, "a positive integer below 2**63")]
Bytes = Annotated[int, Bounds(0, INT64_MAX, "a non-negative number of bytes below 2**63")]
PositiveBytes = Annotated[int, Bounds(1, INT64_MAX, "a positive integer (bytes) below 2**63")]
Messages = Annotated[int, Bounds(1, INT32_MAX, f"a positive integer of at most {INT32_MAX}")]
Seconds = Annotated[
    float, Bounds(0, DAY_S, "a non-negative number of seconds (at most 86400)", integer=False)
]
Timeout = Annotated[
    float,
    Bounds(0, DAY_S, "a positive number of seconds (at most 86400)", integer=False, open_low=True),
]
#: An age after which something unused goes (``max_age_s``): from 1 second to 100 years.
Age = Annotated[
    float, Bounds(1, 36_500 * DAY_S, "a number of seconds from 1 to 3153600000", integer=False)
]
DirMode = Annotated[str, OctalMode()]
HostName = Annotated[str, Host()]
BindHost = Annotated[str, Host(any=True)]
#: A path on this machine: ``~`` expanded (``LocalPath``).
FilePath = Annotated[str, LocalPath()]

_DEFAULT_TEXT = Text()


def marks_of(hint: Any) -> tuple[Check, ...]:
    """The checks an ``Annotated`` hint carries (none for a plain hint)."""
    if typing.get_origin(hint) is not Annotated:
        return ()
    return tuple(m for m in hint.__metadata__ if callable(getattr(m, "check", None)))


def default_marks(hint: Any, name: str) -> tuple[Check, ...]:
    """Checks for a scalar field that declares none (e.g. a config class of an outside tier):
    integers positive (``*_bytes`` non-negative), numbers finite and non-negative (``*timeout_s``
    positive), strings non-empty."""
    if hint is int:
        low = 0 if name.endswith("_bytes") else 1
        word = "a positive integer" if low else "a non-negative integer"
        return (Bounds(low, INT64_MAX, f"{word} below 2**63"),)
    if hint is float:
        positive = name.endswith("timeout_s")
        word = "positive" if positive else "non-negative"
        return (Bounds(0, math.inf, f"a finite, {word} number", integer=False, open_low=positive),)
    return (_DEFAULT_TEXT,) if hint is str else ()


def check_fields(config: Any) -> None:
    """Apply every field's marks to a config dataclass (``None`` values are not checked), and
    store each ``LocalPath`` field expanded (``~``: the home directory), frozen or not."""
    hints = _field_hints(type(config))  # type: ignore[arg-type]
    for name, marks in hints.items():
        value = getattr(config, name)
        if value is None:
            continue
        for mark in marks:
            mark.check(value, name)
        if any(isinstance(mark, LocalPath) for mark in marks):
            object.__setattr__(config, name, expand_path(value))


@functools.cache
def _field_hints(cls: type[Any]) -> dict[str, tuple[Check, ...]]:
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = (f.name for f in dataclasses.fields(cls))
    return {name: marks for name in fields if (marks := field_marks(hints[name]))}


def field_marks(hint: Any) -> tuple[Check, ...]:
    """The checks of a field's ``hint``, or of the non-``None`` member of an optional one."""
    members = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is not Annotated and len(members) == 1:
        return marks_of(members[0])
    return marks_of(hint)


_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


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


_URL_USER = re.compile(r"(\b[a-zA-Z][\w+.-]*://)[^/\s@]*@")


def redact_urls(text: str) -> str:
    """``text`` with the user:password of every URL in it shown as ``***``."""
    return _URL_USER.sub(r"\1***@", text)


@contextlib.contextmanager
def listen_errors(keys: str, address: str) -> Iterator[None]:
    """Re-raise a failure to resolve or bind ``address`` (``OSError`` such as ``gaierror`` or
    ``EADDRINUSE``, ``OverflowError``, a ZeroMQ error) as a ``ConfigError`` naming ``keys``.

    For the services a manager starts: ``with listen_errors("metrics_host, metrics_port",
    f"{host}:{port}"): ...``. Other exceptions pass through unchanged.
    """
    try:
        yield
    except (OSError, OverflowError) as exc:
        raise ConfigError(f"{keys}: cannot listen on {address} ({error_reason(exc)})") from exc
    except Exception as exc:
        if not type(exc).__module__.startswith("zmq"):
            raise
        raise ConfigError(f"{keys}: cannot listen on {address} ({exc})") from exc


@contextlib.contextmanager
def key_path(prefix: str) -> Iterator[None]:
    """Prefix ``prefix.`` to a ``ConfigError`` raised inside (unless it names the key already).

    For errors only construction finds (a key file that cannot be read, a module that cannot
    be loaded), so that they name the key as the parser's do.
    """
    try:
        yield
    except ConfigError as exc:
        if str(exc).startswith(prefix):
            raise
        raise ConfigError(f"{prefix}.{exc}") from exc


def error_reason(exc: BaseException) -> str:
    """An exception's reason: an ``OSError``'s ``strerror``, else its message."""
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def physical_memory_bytes() -> int | None:
    """This host's physical memory (``SC_PAGE_SIZE * SC_PHYS_PAGES``), ``None`` if unknown."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def _kind(value: Any) -> str:
    words = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return words.get(type(value), type(value).__name__)
