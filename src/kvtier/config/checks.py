"""Static checks of configuration values: number ranges, text, keys, modes and paths (host
names, endpoints and URLs: ``addresses``).

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
import math
import os
import re
import types
import typing
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol, Union

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


#: The longest tier name: it is a metric label, a word in logs and a cell in tables.
MAX_LABEL_CHARS = 100


@dataclass(frozen=True)
class Label:
    """A name operators read (a tier's): ``Text`` of at most ``MAX_LABEL_CHARS`` characters,
    without leading or trailing whitespace and without control or format characters (Unicode
    category C: a newline, an escape, a bidirectional override) or line and paragraph
    separators, which could forge log lines or drive a terminal. Other Unicode is welcome."""

    def check(self, value: Any, path: str) -> None:
        Text().check(value, path)
        if len(value) > MAX_LABEL_CHARS:
            raise ConfigError(f"{path}: expected at most {MAX_LABEL_CHARS} characters")
        odd = [c for c in value if unicodedata.category(c)[0] == "C" or c in "\u2028\u2029"]
        if odd:
            raise ConfigError(
                f"{path}: expected printable text, got U+{ord(odd[0]):04X} in {shown(value)}"
            )
        if value != value.strip():
            raise ConfigError(f"{path}: expected no leading or trailing space, got {shown(value)}")


@dataclass(frozen=True)
class PythonName:
    """A class name (an identifier), or with ``dotted`` a module name (identifiers joined by
    dots, as ``importlib.import_module`` takes them): checked when read, imported later."""

    dotted: bool = False

    def check(self, value: Any, path: str) -> None:
        Text().check(value, path)
        if not all(part.isidentifier() for part in (value.split(".") if self.dotted else [value])):
            kind = "a dotted module name such as my_tiers.disk" if self.dotted else "a class name"
            raise ConfigError(f"{path}: expected {kind}, got {value!r}")


@dataclass(frozen=True)
class OneOf:
    """One of ``values``, of the same type too (``1`` is not ``True``, ``"false"`` is not
    ``False``): what ``check_fields`` applies to a ``Literal`` or ``bool`` field, which the
    parser checks on its own."""

    values: tuple[Any, ...]

    def check(self, value: Any, path: str) -> None:
        if not any(type(value) is type(v) and value == v for v in self.values):
            raise ConfigError(f"{path}: expected one of {list(self.values)}, got {value!r}")


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
#: A tier's ``name`` (``Label``).
TierName = Annotated[str, Label()]
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
    """Apply every field's marks to a config dataclass (a ``Literal`` or ``bool`` field's
    ``OneOf`` too; ``None`` only where the field is optional, unchecked), and store each
    ``LocalPath`` field expanded (``~``: the home directory), frozen or not."""
    hints = _field_hints(type(config))  # type: ignore[arg-type]
    for name, (marks, optional) in hints.items():
        value = getattr(config, name)
        if value is None and optional:
            continue
        for mark in marks:
            mark.check(value, name)
        if any(isinstance(mark, LocalPath) for mark in marks):
            object.__setattr__(config, name, expand_path(value))


@functools.cache
def _field_hints(cls: type[Any]) -> dict[str, tuple[tuple[Check, ...], bool]]:
    """Per field with checks: its checks, and whether it may be ``None``."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = (f.name for f in dataclasses.fields(cls))
    checked = {name: _declared_marks(hints[name], name) for name in fields}
    return {n: (marks, _is_optional(hints[n])) for n, marks in checked.items() if marks}


def _declared_marks(hint: Any, name: str) -> tuple[Check, ...]:
    """A field's marks, or where it declares none, what the parser checks of its type."""
    marks = field_marks(hint) + _choice_marks(hint)
    return marks or type_marks(_non_optional(hint), name)


def _non_optional(hint: Any) -> Any:
    members = [a for a in typing.get_args(hint) if a is not type(None)]
    return members[0] if _is_optional(hint) and len(members) == 1 else hint


def type_marks(hint: Any, name: str) -> tuple[Check, ...]:
    """Checks of a hint without marks, as the parser applies them to JSON: a plain scalar's
    ``default_marks``, a nested config's class, each item of a tuple (``secondary_tiers``)."""
    if typing.get_origin(hint) is Annotated:
        return marks_of(hint)
    if typing.get_origin(hint) is tuple:
        return (Items(type_marks(typing.get_args(hint)[0], name)),)
    if getattr(hint, "_is_protocol", False):  # TierConfig: any tier entry's dataclass
        return (Instance(object, "a tier entry", entry=True),)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return (Instance(hint, f"a {hint.__name__}"),)
    return default_marks(hint, name)


@dataclass(frozen=True)
class Instance:
    """A nested config: an instance of ``cls`` (with ``entry``, a tier entry's dataclass)."""

    cls: type[Any]
    expected: str
    entry: bool = False

    def check(self, value: Any, path: str) -> None:
        entry = dataclasses.is_dataclass(value) and hasattr(value, "type_name")
        if not isinstance(value, self.cls) or (self.entry and not entry):
            raise ConfigError(f"{path}: expected {self.expected}, got {_kind(value)}")


@dataclass(frozen=True)
class Items:
    """A list or tuple whose every item passes ``marks``."""

    marks: tuple[Check, ...]

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected a list, got {_kind(value)}")
        for index, item in enumerate(value):
            for mark in self.marks:
                mark.check(item, f"{path}[{index}]")


def _is_optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType) and type(None) in hint.__args__


def _choice_marks(hint: Any) -> tuple[Check, ...]:
    """A ``OneOf`` for a ``Literal`` or ``bool`` field (or an optional one), else none."""
    members = [a for a in typing.get_args(hint) if a is not type(None)]
    if _is_optional(hint) and len(members) == 1:
        hint = members[0]
    if hint is bool:
        return (OneOf((True, False)),)
    if typing.get_origin(hint) is Literal:
        return (OneOf(typing.get_args(hint)),)
    return ()


def field_marks(hint: Any) -> tuple[Check, ...]:
    """The checks of a field's ``hint``, or of the non-``None`` member of an optional one."""
    members = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is not Annotated and len(members) == 1:
        return marks_of(members[0])
    return marks_of(hint)


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
