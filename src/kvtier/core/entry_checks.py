"""Entry-point guards of ``TieringManager``: its lock, its closed state, and key types.

``serialized`` runs a method under the manager's lock (an ``RLock`` shared with a peer server's
driver thread). ``engine_call`` also refuses a closed manager (``ClosedError``) and keys that
are not a sequence of 32-byte ``ChunkKey`` (``InvalidKeyError``), so misuse raises in the
caller's thread at the call, never later in a tier's thread. ``check_parent``, ``check_flag``
and ``checked_timeout`` do the same for the other arguments a tier or a wait would trip over.
"""

from __future__ import annotations

import functools
import math
import numbers
import threading
from collections.abc import Callable, Sequence
from typing import Concatenate, ParamSpec, Protocol, TypeVar

import numpy as np

from kvtier.errors import ClosedError, InvalidArgumentError, InvalidKeyError, shown
from kvtier.keys import KEY_BYTES, ChunkKey

P = ParamSpec("P")
R = TypeVar("R")


class Monitor(Protocol):
    """What the guards need of the object they guard."""

    _lock: threading.RLock
    _closed: bool


M = TypeVar("M", bound=Monitor)


def serialized(method: Callable[Concatenate[M, P], R]) -> Callable[Concatenate[M, P], R]:
    """Run ``method`` under the object's lock."""

    def locked(self: M, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            return method(self, *args, **kwargs)

    functools.update_wrapper(locked, method)
    return locked


def engine_call(
    method: Callable[Concatenate[M, Sequence[ChunkKey], P], R],
) -> Callable[Concatenate[M, Sequence[ChunkKey], P], R]:
    """``serialized``, refusing a closed object and keys that are not ``ChunkKey``s."""

    def checked(self: M, keys: Sequence[ChunkKey], /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            if self._closed:
                raise ClosedError(f"{method.__name__}: the manager is closed")
            check_keys(method.__name__, keys)
            return method(self, keys, *args, **kwargs)

    functools.update_wrapper(checked, method)
    return checked


def check_keys(where: str, keys: Sequence[ChunkKey]) -> None:
    """``InvalidKeyError`` unless ``keys`` is a sequence (a list or tuple: read more than once,
    in order; never a str, bytes, set, dict or iterator) of 32-byte ``ChunkKey``s."""
    if type(keys) not in (list, tuple) and (
        not isinstance(keys, Sequence) or isinstance(keys, (str, bytes))
    ):
        raise InvalidKeyError(
            f"{where}: keys must be a sequence of ChunkKey (a list or tuple, not a "
            f"{type(keys).__name__}; see chunk_keys)"
        )
    if not set(map(type, keys)) <= {ChunkKey} or not set(map(len, keys)) <= {KEY_BYTES}:
        raise InvalidKeyError(
            f"{where}: keys must be a sequence of {KEY_BYTES}-byte ChunkKey (see chunk_keys)"
        )


def check_parent(where: str, parent: object) -> None:
    """``InvalidKeyError`` unless ``parent`` is ``None`` or a 32-byte key (the chunk before
    ``keys[0]``): tiers write it with every chunk of the store, and evict by it."""
    if parent is not None and not (isinstance(parent, bytes) and len(parent) == KEY_BYTES):
        raise InvalidKeyError(
            f"{where}: parent must be None or the {KEY_BYTES}-byte ChunkKey before keys[0]"
        )


def check_flag(where: str, name: str, value: object) -> None:
    """``InvalidArgumentError`` unless ``value`` is ``True`` or ``False`` (a numpy bool too):
    a truthy ``"false"`` passed as ``success`` would serve slots the engine never filled."""
    if not isinstance(value, bool | np.bool_):
        raise InvalidArgumentError(f"{where}: {name} must be True or False, got {shown(value)}")


def checked_timeout(where: str, timeout: object) -> float | None:
    """``timeout`` for a wait: ``None`` (no bound) or a number of seconds (<= 0: do not wait);
    ``InvalidArgumentError`` for anything else, NaN included (a deadline no clock reaches)."""
    if timeout is None:
        return None
    try:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise TypeError
        seconds = float(timeout)  # OverflowError past the floats
    except (TypeError, OverflowError):
        raise InvalidArgumentError(
            f"{where}: timeout must be seconds or None, got {shown(timeout)}"
        ) from None
    if math.isnan(seconds):
        raise InvalidArgumentError(f"{where}: timeout must be a number of seconds, not NaN")
    return seconds


def under_lock(lock: threading.RLock, read: Callable[[], R]) -> Callable[[], R]:
    """``read`` wrapped to run under ``lock`` (e.g. a gauge read on the metrics HTTP thread)."""

    def locked() -> R:
        with lock:
            return read()

    return locked
