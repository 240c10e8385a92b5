"""Errors raised by kvtier.

A miss is a return value, never an exception. Exceptions are for misuse, bad configuration and
tiers that cannot start. The hierarchy::

    KVTierError                 base of everything kvtier raises
    ├── ConfigError             a configuration key is unknown, mistyped or impossible
    ├── TierError               a secondary tier failed (foreign errors are wrapped with ``from``)
    │   └── TierUnavailable     the tier cannot be reached right now (endpoint down, peer gone)
    ├── IntegrityError          bytes from a tier failed verification (header, key, checksum)
    ├── CapacityError           a region or tier cannot hold what was asked of it
    ├── ClosedError             a manager was called after ``close`` (also a ``RuntimeError``)
    ├── InvalidKeyError         a key that is not a ``ChunkKey`` (also a ``TypeError``)
    ├── InvalidArgumentError    an argument out of range, e.g. a priority (also a ``ValueError``)
    └── HoldError               a release without a matching hold (``kvtier.core.host_slots``)
"""

from __future__ import annotations


class KVTierError(Exception):
    """Base class of every error kvtier raises."""


class ConfigError(KVTierError, ValueError):
    """A configuration value is unknown, of the wrong type, or impossible.

    The message names the key (as a dotted path, e.g. ``secondary_tiers[0].root_dir``) and what
    was expected.
    """


class TierError(KVTierError):
    """A secondary tier failed an operation."""


class TierUnavailable(TierError):
    """A secondary tier cannot be reached right now."""


class IntegrityError(KVTierError):
    """Bytes read back from a tier do not match what was stored.

    ``reason`` is a short, stable word for counters: ``magic``, ``version``, ``header``,
    ``identity``, ``key``, ``length``, ``checksum``, ``short``.
    """

    def __init__(self, message: str, reason: str = "unknown") -> None:
        super().__init__(message)
        self.reason = reason


class CapacityError(KVTierError):
    """A host region or tier is too small for what was asked of it."""


class ClosedError(KVTierError, RuntimeError):
    """The manager was closed: it stores, loads and looks up nothing any more."""


class InvalidKeyError(KVTierError, TypeError):
    """A key given to the manager is not a 32-byte ``ChunkKey`` (see ``chunk_keys``)."""


class HoldError(KVTierError):
    """A release of host slots by an owner that does not hold them (nothing was released)."""


class InvalidArgumentError(KVTierError, ValueError):
    """An argument of an engine-facing call is out of range (e.g. a priority above 100)."""


def shown(value: object, limit: int | None = 40) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters (``None``: whole);
    never raises (an int of more than 4,300 digits, alone or in a container, has no ``repr``).
    Short by default: a value from a request may be built to flood the logs."""
    try:
        text = repr(value)
    except ValueError:
        inside = "" if isinstance(value, int) else f" in a {type(value).__name__}"
        return f"an integer of more than 4300 digits{inside}"
    return text if limit is None or len(text) <= limit else f"{text[: limit - 3]}..."
