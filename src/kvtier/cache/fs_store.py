"""The fs tier's layout, walked for ``kvtier cache``: namespaces, chunk files, their links.

Layout (``kvtier.tiers.fs.files``): ``ROOT/<64 hex digest>/identity.json`` and
``ROOT/<digest>/ab/cd/<64 hex key>`` chunk files (``*.tmp`` beside them: writes in progress).
Only entries at those places with those names are kvtier's. Everything else is *foreign*:
counted, named in a line, never read as a chunk and never deleted. Like the tier's own scan
(``kvtier.tiers.fs.scan``), every level is opened below the one before it with ``O_NOFOLLOW``
(``kvtier.tiers.fs.paths``), so no link is followed and no open blocks; a link, FIFO or socket
where a directory or chunk belongs is skipped and counted (``not_regular``), and a directory
that cannot be listed is counted under its errno name (``EACCES``...). The root itself may be a
link (the operator's choice of where the cache lives).

Listing reads ``DirEntry`` types from the kernel's d_type and ``lstat``s chunk files only;
``du`` and ``gc`` also ``pread`` each chunk's link (``LINK_BYTES`` bytes). A namespace's
descriptor stays open while it is worked on (``FsNamespace.fd``); every chunk is reached from it.

Thread safety: ``FsStore`` is built and walked on one thread; ``open_chunk`` and the
``remove_*`` methods may run on any thread while a walk goes on.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from kvtier.cache.fs_records import (
    KEY_NAME,
    LEVEL_NAME,
    SCAN_THREADS,
    TEMPORARY_NAME,
    entries_of,
    open_level,
    parent_bytes,
    parents_of,
    tree_records,
    why,
)
from kvtier.cache.identity_doc import MAX_BYTES, IdentityInfo, parse_identity, problem_kind
from kvtier.cache.records import Problems, Usage
from kvtier.cache.store import Chunk, ChunkRead, Scratch
from kvtier.errors import KVTierError
from kvtier.tiers.fs.paths import (
    NotRegularError,
    chunk_dir,
    open_beneath,
    open_regular,
)
from kvtier.tiers.fs.shared_bound import LEDGER_NAME
from kvtier.tiers.shared import codec

#: Bytes read (and hashed, while still in CPU cache) per call.
READ_STEP = 1 << 20


class TargetError(KVTierError):
    """The target cannot be worked on at all (missing, not a directory, unreachable bucket)."""


@dataclass
class FsNamespace:
    """One identity's directory, open as ``fd`` until ``FsStore.close``."""

    digest: str
    fd: int
    info: IdentityInfo

    @property
    def where(self) -> str:
        return self.digest


class FsStore:
    """The kvtier chunks under ``root`` (an fs tier's ``root_dir``); ``TargetError`` when
    ``root`` cannot be opened as a directory."""

    kind = "fs"

    def __init__(self, root: str) -> None:
        self.root = root
        try:
            self._root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (OSError, ValueError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            raise TargetError(f"{root}: cannot open the cache directory ({why})") from None
        self._open: list[FsNamespace] = []
        self._temporaries: dict[str, list[str]] = {}  # by digest: what the last walk met

    def close(self) -> None:
        """Close every namespace descriptor and the root's."""
        for ns in self._open:
            with suppress(OSError):
                os.close(ns.fd)
        self._open.clear()
        with suppress(OSError):
            os.close(self._root_fd)

    def path(self, ns: FsNamespace, name: str = "") -> str:
        """The path of chunk ``name`` (or the namespace) for messages."""
        tail = f"/{name[:2]}/{name[2:4]}/{name}" if name else ""
        return os.path.join(self.root, ns.digest) + tail

    # -- namespaces --------------------------------------------------------------------------
    def namespaces(self, problems: Problems) -> list[FsNamespace]:
        """Every namespace directory under the root, opened, with its identity.json read."""
        found: list[FsNamespace] = []
        for entry in entries_of(self._root_fd, self.root, problems):
            where = os.path.join(self.root, entry.name)
            if entry.name == LEDGER_NAME:
                continue  # root_dir_max_bytes' ledger: kvtier's, not a namespace
            if not KEY_NAME.fullmatch(entry.name):
                problems.note("foreign", where, "not kvtier's; left alone")
                continue
            fd = open_level(entry.name, self._root_fd, where, problems)
            if fd is not None:
                ns = FsNamespace(entry.name, fd, self._identity(fd, where, problems))
                self._open.append(ns)
                found.append(ns)
        return sorted(found, key=lambda ns: ns.digest)

    def _identity(self, fd: int, where: str, problems: Problems) -> IdentityInfo:
        raw = None
        try:
            file_fd, found = open_regular(fd, "identity.json", os.O_RDONLY)
            with os.fdopen(file_fd, "rb") as file:
                raw = file.read(min(found.st_size, MAX_BYTES) + 1)
        except FileNotFoundError:
            pass
        except OSError as exc:
            reason = why(exc).removeprefix("identity.json: ")  # NotRegularError names it
            problems.note("bad_identity", f"{where}/identity.json", reason)
            return IdentityInfo(problem=f"identity.json: {reason}")
        info = parse_identity(raw)
        if info.problem is not None:
            problems.note(problem_kind(info), f"{where}/identity.json", info.problem)
        return info

    # -- walking -----------------------------------------------------------------------------
    def records(self, ns: FsNamespace, problems: Problems, *, links: bool) -> Iterator[Any]:
        """Each ``ab`` directory's chunk files as ``native.CHUNK_RECORD`` rows, listed by
        ``SCAN_THREADS`` threads: regular files named by a key under their own ``ab/cd``
        (``fs_records``); with ``links`` their links too. The rest is counted in ``problems``
        (``foreign``, ``not_regular``, ``in_progress``)."""
        base = self.path(ns)
        levels = list(self._top_levels(ns, base, problems))
        temporaries: list[str] = []
        self._temporaries[ns.digest] = temporaries

        def scan(name: str) -> Any:
            where = f"{base}/{name}"
            return tree_records(ns.fd, name, where, problems, links=links, temporaries=temporaries)

        with ThreadPoolExecutor(SCAN_THREADS, thread_name_prefix="kvtier-cache-scan") as pool:
            yield from pool.map(scan, levels)

    def _top_levels(self, ns: FsNamespace, base: str, problems: Problems) -> Iterator[str]:
        for entry in entries_of(ns.fd, base, problems):
            if entry.name == "identity.json":
                continue
            if LEVEL_NAME.fullmatch(entry.name):
                yield entry.name
            else:
                problems.note("foreign", f"{base}/{entry.name}", "not kvtier's; left alone")

    def usage(self, ns: FsNamespace, problems: Problems, *, links: bool) -> Usage:
        """``ns``'s totals; with ``links``, also its unreachable chunks (unknown when part of
        ``ns`` could not be listed)."""
        usage, watch = Usage(), problems.watch()
        for rows in self.records(ns, problems, links=links):
            if not len(rows):
                continue
            usage.chunks += len(rows)
            usage.bytes += int(rows["size"].sum())
            usage.disk_bytes += int(rows["disk"].sum())
            usage.add_times(float(rows["mtime"].min()), float(rows["mtime"].max()))
            if links:
                usage.keys += rows["key"].tobytes()
                usage.parents += parent_bytes(rows)
        if links:
            usage.settle_links(complete=not watch.failed)
        return usage

    def chunks(self, ns: FsNamespace, problems: Problems) -> Iterator[Chunk]:
        """``ns``'s chunk files with their sizes, mtimes and parents."""
        for rows in self.records(ns, problems, links=True):
            for row, parent in zip(rows, parents_of(rows), strict=True):
                yield bytes(row["key"]).hex(), int(row["size"]), float(row["mtime"]), parent

    def names(self, ns: FsNamespace, problems: Problems) -> Iterator[tuple[str, int]]:
        """``ns``'s chunk names (size 0: ``read`` takes it from ``fstat``)."""
        for rows in self.records(ns, problems, links=False):
            for key in rows["key"]:
                yield bytes(key).hex(), 0

    # -- reading and removing ----------------------------------------------------------------
    def read(self, ns: FsNamespace, name: str, size: int, scratch: Scratch) -> ChunkRead | None:
        """Chunk ``name`` read in ``READ_STEP`` pieces into ``scratch``, the payload of a
        version-1 chunk hashed piece by piece; ``None`` when it is gone. Raises ``OSError``.
        Reads the header, then at most one byte more of payload than the header claims (none
        when it is no kvtier header): a file longer than that (a huge sparse one) is judged
        by what was read and never held in memory."""
        try:
            fd, found = self.open_chunk(ns, name)
        except FileNotFoundError:
            return None
        try:
            with suppress(OSError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            view, head = _header_first(fd, found.st_size, scratch)
            hasher = codec.filling(view[head:]) if _plain(view[:head]) else None
            end = head + _read_hashed(fd, view[head:], head, hasher)
            checksum = hasher.digest(end - head) if hasher is not None else None
            payload = view[codec.HEADER_BYTES : max(end, codec.HEADER_BYTES)]
            return ChunkRead(view[:head], payload, checksum, (found.st_dev, found.st_ino))
        finally:
            os.close(fd)

    def open_chunk(self, ns: FsNamespace, name: str) -> tuple[int, os.stat_result]:
        """Chunk ``name`` open for reading, and its ``fstat``; ``FileNotFoundError`` when it is
        gone, ``NotRegularError`` when it is not a regular file, ``OSError`` otherwise."""
        fd = open_beneath(ns.fd, name, os.O_RDONLY)
        if fd is None:
            with chunk_dir(ns.fd, name) as directory:
                return open_regular(directory, name, os.O_RDONLY)
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            os.close(fd)
            raise NotRegularError(name)
        return fd, found

    def remove_bad(self, ns: FsNamespace, name: str, seen: object) -> bool:
        """Unlink chunk file ``name`` unless it was replaced since it was read as ``seen``
        (its ``(st_dev, st_ino)``); whether it was removed. Never raises ``OSError``."""
        return self._unlink(ns, name, lambda now: (now.st_dev, now.st_ino) == seen)

    def remove_cold(self, ns: FsNamespace, name: str, mtime: float) -> bool:
        """Unlink chunk file ``name`` unless it was used (its mtime moved) since the listing
        saw ``mtime``; whether it was removed. Never raises ``OSError``."""
        return self._unlink(ns, name, lambda now: now.st_mtime <= mtime)

    def temporaries(self, ns: FsNamespace) -> Iterator[tuple[str, int, float]]:
        """The temporary files of writes that the last walk of ``ns`` met and that are still
        there as regular files: name, size, mtime."""
        for name in self._temporaries.get(ns.digest, ()):
            try:
                with chunk_dir(ns.fd, name) as directory:
                    found = os.stat(name, dir_fd=directory, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(found.st_mode):
                yield name, found.st_size, found.st_mtime

    def remove_temporary(self, ns: FsNamespace, name: str, mtime: float) -> bool:
        """Unlink temporary file ``name`` unless it was written since ``mtime`` (its writer is
        still at it); whether it was removed. Never raises ``OSError``."""
        return self._unlink(ns, name, lambda now: now.st_mtime <= mtime)

    def _unlink(self, ns: FsNamespace, name: str, still: Callable[[os.stat_result], bool]) -> bool:
        # only ever a chunk file of the layout, or a write's temporary file beside one
        assert KEY_NAME.fullmatch(name) or TEMPORARY_NAME.fullmatch(name), name
        try:
            with chunk_dir(ns.fd, name) as directory:
                now = os.stat(name, dir_fd=directory, follow_symlinks=False)
                if not stat.S_ISREG(now.st_mode) or not still(now):
                    return False
                os.unlink(name, dir_fd=directory)
                return True
        except OSError:
            return False


def _header_first(fd: int, size: int, scratch: Scratch) -> tuple[memoryview, int]:
    """A view of ``scratch`` for chunk file ``fd`` of ``size`` bytes, with its header read in
    (the bytes read: the second value), as long as the header and one byte more of payload
    than the header claims (no payload when it is no kvtier header), at most ``size``."""
    first = scratch.view(min(size, codec.HEADER_BYTES))
    head = _read_at(fd, first, 0)
    view = scratch.view(min(size, codec.HEADER_BYTES + _claimed(first[:head]) + 1))
    view[:head] = first[:head]  # the buffer may have been replaced by a larger one
    return view, head


def _claimed(header: memoryview) -> int:
    """The payload length ``header`` (version 1 or 2) states; 0 when it is no kvtier header."""
    try:
        if codec.format_version(header) == codec.SEALED_VERSION:
            return codec.decode_sealed(header).payload_len
        return codec.decode_header(header).payload_len
    except KVTierError:
        return 0


def _plain(header: memoryview) -> bool:
    """Whether ``header`` is a version-1 (checksummed) chunk header."""
    try:
        return codec.format_version(header) == codec.FORMAT_VERSION
    except KVTierError:
        return False


def _read_at(fd: int, view: memoryview, offset: int) -> int:
    """Fill ``view`` from ``offset``; the bytes read (fewer at end of file)."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def _read_hashed(fd: int, view: memoryview, offset: int, hasher: Any) -> int:
    """Fill ``view`` from ``offset`` in ``READ_STEP`` pieces, each fed to ``hasher``
    (``codec.filling`` of ``view``) as it lands."""
    done = 0
    while done < len(view):
        piece = view[done : done + READ_STEP]
        n = _read_at(fd, piece, offset + done)
        done += n
        if hasher is not None:
            hasher.feed(done)
        if n < len(piece):
            break  # the file ended early (truncated): verify says so
    return done
