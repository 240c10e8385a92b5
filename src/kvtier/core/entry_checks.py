"""Entry-point guards of ``TieringManager``: its lock, its closed state, and key types.

``serialized`` runs a method under the manager's lock (an ``RLock`` shared with a peer server's
driver thread). ``engine_call`` also refuses a closed manager (``ClosedError``) and keys that
are not ``ChunkKey`` (``InvalidKeyError``), so misuse raises in the caller's thread at the call,
never later in a tier's thread.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from kvtier.errors import ClosedError, InvalidKeyError
from kvtier.keys import ChunkKey

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
    """``InvalidKeyError`` unless ``keys`` is a sequence of ``ChunkKey`` (a str or bytes is not)."""
    if isinstance(keys, (str, bytes)) or not set(map(type, keys)) <= {ChunkKey}:
        raise InvalidKeyError(f"{where}: keys must be a sequence of ChunkKey (see chunk_keys)")


def under_lock(lock: threading.RLock, read: Callable[[], R]) -> Callable[[], R]:
    """``read`` wrapped to run under ``lock`` (e.g. a gauge read on the metrics HTTP thread)."""

    def locked() -> R:
        with lock:
            return read()

    return locked
