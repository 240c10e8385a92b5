"""Drops: the keys a ``ChunkIndex`` evicted or discarded, numbered, for looks at the store.

A listing or a probe (a ``stat``, a ``HEAD``) may see a chunk whose delete has not run yet, or
ran between the look and its answer. ``mark`` before the look; ``raced(key, since)`` then says
whether the key was dropped, or its delete ended, after that mark, or whether an evicted key's
delete is still on its way: such a key must not be indexed on the look's word.

Memory is bounded: the last ``MAX_DROPPED_REMEMBERED`` drops, and as many deletes on their way.
A look that began before drops that were forgotten since may index a key whose delete raced
it: it is evicted again, or found missing at its load, never served wrong.

No lock of its own: ``ChunkIndex`` calls it under its lock.
"""

from __future__ import annotations

from collections import OrderedDict

#: Drops remembered (about 150 bytes each), and deletes on their way at most.
MAX_DROPPED_REMEMBERED = 1 << 16


class Drops:
    """Numbered drops and deletes on their way; see the module docstring."""

    def __init__(self) -> None:
        self._count = 0  # drops so far: the number of the last
        self._numbers: OrderedDict[bytes, int] = OrderedDict()  # key -> its last drop's number
        self._deleting: OrderedDict[bytes, None] = OrderedDict()  # evicted, delete not ended

    def mark(self) -> int:
        return self._count

    def note(self, key: bytes, deleting: bool = False) -> None:
        """``key`` was dropped; with ``deleting``, its delete is on its way (until
        ``deleted``)."""
        self._count += 1
        self._numbers[key] = self._count
        self._numbers.move_to_end(key)
        _trim(self._numbers)
        if deleting:
            self._deleting[key] = None
            _trim(self._deleting)

    def deleted(self, key: bytes, indexed: bool) -> None:
        """``key``'s delete ended: numbered again, unless it is ``indexed`` again meanwhile."""
        self._deleting.pop(key, None)
        if not indexed:
            self.note(key)

    def raced(self, key: bytes, since: int | None) -> bool:
        """Whether a look that began at ``since`` (``None``: no look) may have raced ``key``'s
        delete."""
        if since is None:
            return False
        return key in self._deleting or self._numbers.get(key, 0) > since


def _trim(entries: OrderedDict[bytes, int] | OrderedDict[bytes, None]) -> None:
    while len(entries) > MAX_DROPPED_REMEMBERED:
        entries.popitem(last=False)
