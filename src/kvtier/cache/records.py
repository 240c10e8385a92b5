"""What the cache commands report: problems met on the way, and one identity's usage.

``Problems`` counts each kind of trouble (a foreign entry, a truncated chunk, an unreadable
directory) and keeps the first lines of each kind for the operator; nothing is raised for
them. ``Usage`` is one identity's totals as ``ls`` and ``du`` print them. ``count_unreachable``
finds chunks whose link names a parent that is not held.

Thread safety: ``Problems`` takes its lock in every method; ``Usage`` belongs to one thread.
"""

from __future__ import annotations

import errno
import threading
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

#: Lines kept per kind of problem (the rest are only counted).
LINES_PER_KIND = 20
#: Kinds that are not the cache's fault: counted and shown, but no reason for a failing status.
BENIGN = frozenset({"foreign", "vanished", "in_progress", "sealed_unverified", "no_identity"})
_FAILURES = frozenset(errno.errorcode.values()) | {"unreadable"}


class Problems:
    """Counters by kind, with the first ``LINES_PER_KIND`` lines of each kind."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def note(self, kind: str, where: str, why: str = "", *, quiet: bool = False) -> None:
        """Count ``kind`` at ``where`` (a path or object name); keep a line unless ``quiet``."""
        with self._lock:
            self.counts[kind] += 1
            if not quiet and self.counts[kind] <= LINES_PER_KIND:
                self.lines.append(one_line(f"{kind}: {where}" + (f": {why}" if why else "")))

    def add(self, kind: str, n: int) -> None:
        """Count ``n`` of ``kind`` without a line (foreign entries found in bulk)."""
        if n:
            with self._lock:
                self.counts[kind] += n

    def serious(self) -> int:
        """How many problems are not ``BENIGN``."""
        with self._lock:
            return sum(n for kind, n in self.counts.items() if kind not in BENIGN)

    def failures(self) -> int:
        """How many problems are named by an errno (``EACCES``, ``EIO``...) or ``unreadable``
        (a bucket's answer): something that could not be opened, listed or read."""
        with self._lock:
            return sum(n for kind, n in self.counts.items() if kind in _FAILURES)

    def watch(self) -> FailureWatch:
        """A watch whose ``failed`` says whether a failure was noted after this call: a listing
        that failed meanwhile is partial, and what was not seen may still be there."""
        return FailureWatch(self, self.failures())

    def summary(self) -> str:
        """``kind=n`` pairs, sorted by kind; empty when there were none."""
        with self._lock:
            return " ".join(f"{kind}={n}" for kind, n in sorted(self.counts.items()))


@dataclass(frozen=True)
class FailureWatch:
    """See ``Problems.watch``."""

    problems: Problems
    start: int

    @property
    def failed(self) -> bool:
        return self.problems.failures() != self.start


@dataclass
class Usage:
    """One identity's chunks: count, bytes (file sizes), bytes on disk (allocated blocks),
    oldest and newest use (modification times; ``None`` with no chunk), unreachable chunks
    (``None``: not computed, or not known). Writes in progress are counted in ``Problems``
    (``in_progress``), not here."""

    chunks: int = 0
    bytes: int = 0
    disk_bytes: int = 0
    oldest: float | None = None
    newest: float | None = None
    unreachable: int | None = None
    keys: bytearray = field(default_factory=bytearray, repr=False)
    parents: bytearray = field(default_factory=bytearray, repr=False)

    def add_times(self, oldest: float, newest: float) -> None:
        self.oldest = oldest if self.oldest is None else min(self.oldest, oldest)
        self.newest = newest if self.newest is None else max(self.newest, newest)

    def merge(self, other: Usage) -> None:
        """Add ``other``'s totals (not its keys) into this one."""
        self.chunks += other.chunks
        self.bytes += other.bytes
        self.disk_bytes += other.disk_bytes
        if other.oldest is not None and other.newest is not None:
            self.add_times(other.oldest, other.newest)
        if other.unreachable is not None:
            self.unreachable = (self.unreachable or 0) + other.unreachable

    def settle_links(self, complete: bool = True) -> None:
        """Count unreachable chunks from ``keys``/``parents`` and drop them (frees memory);
        not ``complete`` (part of the identity could not be listed: a predecessor not seen may
        be there), the count is unknown (``None``)."""
        found = count_unreachable(bytes(self.keys), bytes(self.parents)) if complete else None
        self.unreachable = found
        self.keys, self.parents = bytearray(), bytearray()


_NO_PARENT = bytes(32)


def one_line(text: str) -> str:
    """``text`` with control characters escaped (a newline in a file name stays one line)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def count_unreachable(keys: bytes, parents: bytes) -> int:
    """Chunks no prefix lookup can reach: those whose parent (32 bytes each in ``parents``,
    zeros: none or unknown) is not among ``keys`` (32 bytes each, the same chunks in the same
    order), and every chunk after one of them in its chain. Sorts and follows parents by
    pointer jumping in numpy; no per-chunk Python objects."""
    if not keys:
        return 0
    order = np.argsort(np.frombuffer(keys, dtype="V32"), kind="stable")
    have = np.frombuffer(keys, dtype="V32")[order]
    wanted = np.frombuffer(parents, dtype="V32")
    spot = np.searchsorted(have, wanted).clip(max=len(have) - 1)
    present = have[spot] == wanted
    headless = wanted == np.frombuffer(_NO_PARENT, dtype="V32")[0]
    lost = ~present & ~headless
    up = np.where(present, order[spot], np.arange(len(wanted)))
    for _ in range(64):  # 2**64 links: any chain; a cycle of forged links just stops here
        lost |= lost[up]
        further = up[up]
        if np.array_equal(further, up):
            break
        up = further
    return int(np.count_nonzero(lost))
