"""``root_dir_max_bytes``: one bound on everything under ``root_dir``, kept by every instance.

``max_bytes`` bounds what one instance keeps of its own identity's folder; N servers sharing a
directory hold N times that. ``root_dir_max_bytes`` bounds the whole directory, across every
identity, and every instance writing there with it honours it:

* A ledger, ``<root_dir>/.kvtier-usage`` (8 bytes: the total of chunk files), is read and
  written under an exclusive ``flock``. A write adds its size before it starts and takes it
  back if it fails, so the total never passes the bound on account of a write.
* When a write would pass it, the writer deletes chunk files of any identity until it fits,
  in the order of ``ChunkIndex`` over the last listing of the directory (unreachable chunks
  first, then least recently used by mtime, a prefix from its tail). A candidate used since
  that listing (a newer mtime) is skipped. Whoever unlinks a file takes its size off the
  ledger, so two instances never count one deletion twice. A write for which nothing can be
  deleted is not made (``store_skipped_bound``).
* The listing is redone when candidates run out (at most every ``RELIST_S``) and sets the
  ledger to what is really there, which corrects what crashes, ``kvtier cache gc`` or an
  operator's ``rm`` left wrong. Other instances' writes in flight at that moment are not on
  disk yet: the bound holds give or take one chunk per writer in flight.

A server that loses a chunk this way sees a miss: never an error, never wrong bytes. Nothing
but chunk files in the tier's layout is ever deleted.

Thread safety: the ledger's ``flock`` orders processes; a lock orders this instance's threads
(the fs tier's writers).
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from kvtier.config.file_modes import file_mode
from kvtier.errors import TierError
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.tiers.fs.config import FsTierConfig
from kvtier.tiers.fs.paths import chunk_dir, open_level_dir
from kvtier.tiers.fs.scan import scan_namespace
from kvtier.tiers.shared.chunk_index import ChunkIndex

LEDGER_NAME = ".kvtier-usage"
#: The directory is listed again for candidates at most this often.
RELIST_S = 5.0
_TOTAL = struct.Struct("<q")
_NAMESPACE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class _Candidate:
    namespace: str
    key: ChunkKey
    size: int
    mtime: float


class SharedBound:
    """The bound of ``root_dir`` shared with every other instance; see the module docstring.

    ``namespace`` is this instance's folder name (its identity digest): deletions there are
    handed back so that the tier forgets those keys. ``OSError`` at start when the ledger
    cannot be opened.
    """

    def __init__(self, root_dir: str, max_bytes: int, namespace: str, file_mode: int) -> None:
        self.max_bytes, self._namespace = max_bytes, namespace
        self._root = os.open(root_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            self._ledger = os.open(LEDGER_NAME, flags, file_mode, dir_fd=self._root)
            if not stat.S_ISREG(os.fstat(self._ledger).st_mode):
                raise OSError(f"{LEDGER_NAME} in {root_dir} is not a regular file")
        except BaseException:
            os.close(self._root)
            raise
        self._candidates: list[_Candidate] = []
        self._listed_at = -RELIST_S
        self._listed_wall = 0.0
        self._in_flight: dict[bytes, int] = {}  # this instance's reserved writes → bytes
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def reserve(self, nbytes: int, key: ChunkKey) -> list[ChunkKey] | None:
        """Room for a write of ``nbytes`` (chunk ``key``), made by deleting chunks where needed;
        returns this instance's own keys deleted, or ``None`` (nothing reserved) when no room
        can be made."""
        with self._lock, self._locked():
            total = self._total()
            if total + nbytes > self.max_bytes and self._relist_due():
                total = self._relist()
            own: list[ChunkKey] = []
            while total + nbytes > self.max_bytes:
                freed = self._delete_next(own)
                if freed is None:
                    self._set_total(total)
                    return None
                total -= freed
            self._set_total(total + nbytes)
            self._in_flight[key] = nbytes
            return own

    def wrote(self, key: ChunkKey) -> None:
        """The reserved write of ``key`` landed."""
        with self._lock:
            self._in_flight.pop(key, None)

    def release(self, nbytes: int, key: ChunkKey | None = None) -> None:
        """A chunk file this instance counted was deleted, or the reserved write of ``key``
        failed."""
        with self._lock, self._locked():
            self._set_total(max(0, self._total() - nbytes))
            if key is not None:
                self._in_flight.pop(key, None)

    def total(self) -> int:
        """The ledger's total now."""
        with self._lock, self._locked():
            return self._total()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            for fd in (self._ledger, self._root):
                with suppress(OSError):
                    os.close(fd)

    # -- ledger (both locks held) -----------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._ledger, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._ledger, fcntl.LOCK_UN)

    def _total(self) -> int:
        raw = os.pread(self._ledger, _TOTAL.size, 0)
        return max(0, _TOTAL.unpack(raw)[0]) if len(raw) == _TOTAL.size else 0

    def _set_total(self, total: int) -> None:
        os.pwrite(self._ledger, _TOTAL.pack(max(0, total)), 0)

    # -- candidates (both locks held) -------------------------------------------------------
    def _relist_due(self) -> bool:
        return not self._candidates and time.monotonic() - self._listed_at >= RELIST_S

    def _relist(self) -> int:
        """List the directory: candidates in eviction order; returns (and records) the total."""
        self._listed_at, self._listed_wall = time.monotonic(), time.time()
        found = sorted(self._listing(), key=lambda c: (c[0].mtime, c[0].key))
        by_key = {c.key: c for c, _ in found}
        order = ChunkIndex(0).merge_cold((c.key, c.size, parent) for c, parent in found)
        self._candidates = [by_key[k] for k in reversed(order)]
        # a write renamed into place but not yet reported by ``wrote`` is counted once
        landing = sum(n for key, n in self._in_flight.items() if key not in by_key)
        total = sum(c.size for c in by_key.values()) + landing
        self._set_total(total)
        return total

    def _listing(self) -> Iterator[tuple[_Candidate, bytes | None]]:
        for name in self._namespaces():
            try:
                fd = open_level_dir(name, self._root)
            except OSError:
                continue
            try:
                result = scan_namespace(fd, "", self._stop)
            finally:
                os.close(fd)
            for mtime, key, size, parent in result.chunks:
                yield _Candidate(name, key, size, mtime), parent

    def _namespaces(self) -> list[str]:
        with suppress(OSError), os.scandir(self._root) as entries:
            return [e.name for e in entries if _NAMESPACE.fullmatch(e.name)]
        return []

    def _delete_next(self, own: list[ChunkKey]) -> int | None:
        """Delete the next candidate still unused since the listing; the bytes it freed (0 when
        another process got there first), ``None`` when none is left."""
        while self._candidates or self._relist_due():
            if not self._candidates:
                self._relist()
                continue
            candidate = self._candidates.pop()
            freed = self._unlink(candidate)
            if freed is None:
                continue
            if candidate.namespace == self._namespace and freed:
                own.append(candidate.key)
            return freed
        return None

    def _unlink(self, candidate: _Candidate) -> int | None:
        """Unlink one candidate file: its size, 0 when it is gone, ``None`` when it was used
        since the listing (kept) or cannot be reached."""
        name = candidate.key.hex()
        try:
            ns = open_level_dir(candidate.namespace, self._root)
        except OSError:
            return 0
        try:
            with chunk_dir(ns, name) as directory:
                found = os.stat(name, dir_fd=directory, follow_symlinks=False)
                if not stat.S_ISREG(found.st_mode) or found.st_mtime > self._listed_wall:
                    return None
                os.unlink(name, dir_fd=directory)
                return found.st_size
        except FileNotFoundError:
            return 0
        except OSError:
            return None
        finally:
            os.close(ns)


def open_shared_bound(
    config: FsTierConfig, identity: CacheIdentity, dir_mode: int
) -> SharedBound | None:
    """The fs tier's ``root_dir_max_bytes`` bound, or ``None`` without one; ``TierError`` when
    its ledger cannot be opened (the bound would not hold)."""
    if config.root_dir_max_bytes is None:
        return None
    try:
        return SharedBound(
            config.root_dir, config.root_dir_max_bytes, identity.hexdigest, file_mode(dir_mode)
        )
    except OSError as exc:
        raise TierError(f"root_dir_max_bytes: cannot open the usage ledger: {exc}") from exc
