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
import re
import stat
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from kvtier.cache.identity_doc import MAX_BYTES, IdentityInfo, parse_identity, problem_kind
from kvtier.cache.records import Problems, Usage
from kvtier.cache.store import Chunk, ChunkRead, Scratch
from kvtier.errors import KVTierError
from kvtier.tiers.fs.paths import (
    NotRegularError,
    chunk_dir,
    failure_reason,
    open_beneath,
    open_level_dir,
    open_regular,
)
from kvtier.tiers.fs.scan import read_file_link
from kvtier.tiers.fs.shared_bound import LEDGER_NAME
from kvtier.tiers.shared import codec

KEY_NAME = re.compile(r"[0-9a-f]{64}")
_LEVEL_NAME = re.compile(r"[0-9a-f]{2}")
#: Bytes read (and hashed, while still in CPU cache) per call.
READ_STEP = 1 << 20
_NO_PARENT = bytes(32)


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
        for entry in _entries(self._root_fd, self.root, problems):
            where = os.path.join(self.root, entry.name)
            if entry.name == LEDGER_NAME:
                continue  # root_dir_max_bytes' ledger: kvtier's, not a namespace
            if not KEY_NAME.fullmatch(entry.name):
                problems.note("foreign", where, "not kvtier's; left alone")
                continue
            fd = _open_level(entry.name, self._root_fd, where, problems)
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
            problems.note("bad_identity", f"{where}/identity.json", _why(exc))
            return IdentityInfo(problem=f"identity.json: {_why(exc)}")
        info = parse_identity(raw)
        if info.problem is not None:
            problems.note(problem_kind(info), f"{where}/identity.json", info.problem)
        return info

    # -- walking -----------------------------------------------------------------------------
    def chunk_dirs(
        self, ns: FsNamespace, problems: Problems
    ) -> Iterator[tuple[int, list[os.DirEntry[str]]]]:
        """Each ``ab/cd`` directory of ``ns`` (its descriptor, open until the next item) and
        the chunk files in it: regular files named by a key under their own ``ab/cd``. The
        rest is counted in ``problems`` (``foreign``, ``not_regular``, ``in_progress``)."""
        base = self.path(ns)
        for l1, fd1 in self._levels(ns.fd, base, problems, top=True):
            try:
                for l2, fd2 in self._levels(fd1, f"{base}/{l1}", problems, top=False):
                    try:
                        where = f"{base}/{l1}/{l2}"
                        yield fd2, _chunk_entries(fd2, where, l1 + l2, problems)
                    finally:
                        os.close(fd2)
            finally:
                os.close(fd1)

    def _levels(
        self, fd: int, where: str, problems: Problems, *, top: bool
    ) -> Iterator[tuple[str, int]]:
        for entry in _entries(fd, where, problems):
            if top and entry.name == "identity.json":
                continue
            if not _LEVEL_NAME.fullmatch(entry.name):
                problems.note("foreign", f"{where}/{entry.name}", "not kvtier's; left alone")
                continue
            child = _open_level(entry.name, fd, f"{where}/{entry.name}", problems)
            if child is not None:
                yield entry.name, child

    def usage(self, ns: FsNamespace, problems: Problems, *, links: bool) -> Usage:
        """``ns``'s totals; with ``links``, also its unreachable chunks."""
        usage = Usage()
        for fd, entries in self.chunk_dirs(ns, problems):
            for entry in entries:
                try:
                    found = entry.stat(follow_symlinks=False)
                    if links:
                        _add_link(usage, fd, entry.name)
                except FileNotFoundError:
                    continue  # evicted meanwhile
                except OSError as exc:
                    problems.note(failure_reason(exc), entry.path, _why(exc))
                    continue
                _count(usage, found)
        if links:
            usage.settle_links()
        return usage

    def chunks(self, ns: FsNamespace, problems: Problems) -> Iterator[Chunk]:
        """``ns``'s chunk files with their sizes, mtimes and parents."""
        for fd, entries in self.chunk_dirs(ns, problems):
            for entry in entries:
                try:
                    found = entry.stat(follow_symlinks=False)
                    link = read_file_link(fd, entry.name)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    problems.note(failure_reason(exc), entry.path, _why(exc))
                    continue
                parent = link.parent if link is not None else None
                yield entry.name, found.st_size, found.st_mtime, parent

    def names(self, ns: FsNamespace, problems: Problems) -> Iterator[tuple[str, int]]:
        """``ns``'s chunk names (size 0: ``read`` takes it from ``fstat``)."""
        for _, entries in self.chunk_dirs(ns, problems):
            for entry in entries:
                yield entry.name, 0

    # -- reading and removing ----------------------------------------------------------------
    def read(self, ns: FsNamespace, name: str, size: int, scratch: Scratch) -> ChunkRead | None:
        """Chunk ``name`` read in ``READ_STEP`` pieces into ``scratch``, the payload of a
        version-1 chunk hashed piece by piece; ``None`` when it is gone. Raises ``OSError``."""
        try:
            fd, found = self.open_chunk(ns, name)
        except FileNotFoundError:
            return None
        try:
            with suppress(OSError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            view = scratch.view(found.st_size)
            head = _read_at(fd, view[: min(len(view), codec.HEADER_BYTES)], 0)
            hasher = codec.checksum_stream() if _plain(view[:head]) else None
            end = head + _read_hashed(fd, view[head:], head, hasher)
            checksum = hasher.digest() if hasher is not None else None
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

    def _unlink(self, ns: FsNamespace, name: str, still: Callable[[os.stat_result], bool]) -> bool:
        assert KEY_NAME.fullmatch(name), name  # only ever a chunk file of the layout
        try:
            with chunk_dir(ns.fd, name) as directory:
                now = os.stat(name, dir_fd=directory, follow_symlinks=False)
                if not stat.S_ISREG(now.st_mode) or not still(now):
                    return False
                os.unlink(name, dir_fd=directory)
                return True
        except OSError:
            return False


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
    """Fill ``view`` from ``offset`` in ``READ_STEP`` pieces, each hashed as it lands."""
    done = 0
    while done < len(view):
        piece = view[done : done + READ_STEP]
        n = _read_at(fd, piece, offset + done)
        if hasher is not None:
            hasher.update(piece[:n])
        done += n
        if n < len(piece):
            break  # the file ended early (truncated): verify says so
    return done


def _count(usage: Usage, found: os.stat_result) -> None:
    usage.chunks += 1
    usage.bytes += found.st_size
    usage.disk_bytes += found.st_blocks * 512
    usage.add_times(found.st_mtime, found.st_mtime)


def _add_link(usage: Usage, fd: int, name: str) -> None:
    link = read_file_link(fd, name)
    usage.keys += bytes.fromhex(name)
    parent = link.parent if link is not None else None
    usage.parents += parent or _NO_PARENT


def _chunk_entries(fd: int, where: str, prefix: str, problems: Problems) -> list[os.DirEntry[str]]:
    chunks = []
    for entry in _entries(fd, where, problems):
        name = entry.name
        if len(name) == 64 and name.startswith(prefix) and KEY_NAME.fullmatch(name):
            if entry.is_file(follow_symlinks=False):
                chunks.append(entry)
            else:
                problems.note("not_regular", f"{where}/{name}", "not a regular file; skipped")
        elif name.endswith(".tmp") and KEY_NAME.fullmatch(name[:64]):
            problems.add("in_progress", 1)
        else:
            problems.note("foreign", f"{where}/{name}", "not kvtier's; left alone")
    return chunks


def _entries(fd: int, where: str, problems: Problems) -> list[os.DirEntry[str]]:
    """The entries of directory ``fd``; none (counted, with a line) when it cannot be listed."""
    try:
        with os.scandir(fd) as it:
            return list(it)
    except FileNotFoundError:
        return []
    except OSError as exc:
        problems.note(failure_reason(exc), where, f"cannot list: {_why(exc)}")
        return []


def _open_level(name: str, fd: int, where: str, problems: Problems) -> int | None:
    try:
        return open_level_dir(name, fd)
    except FileNotFoundError:
        return None
    except NotRegularError:
        problems.note("not_regular", where, "a link or not a directory; not followed")
    except OSError as exc:
        problems.note(failure_reason(exc), where, f"cannot open: {_why(exc)}")
    return None


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)
