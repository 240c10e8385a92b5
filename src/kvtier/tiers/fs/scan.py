"""The fs tier's start-up scan: which chunk files a namespace holds, and stale temporaries.

A temporary file (``<key>.<host>-<pid>-<token>-<n>.tmp``, see ``files``) is stale when it
is older than ``STALE_TMP_S`` whoever wrote it, or when its writer was a process of this host
that is gone; a running writer's are left alone. The scan walks from the namespace's pinned
descriptor (``pin``), each level opened below the previous one, so nothing below it is
followed: a level that is a link, or an entry that is not what the layout expects there, is
skipped and counted by reason, as is anything that cannot be listed or stat'ed; the scan goes
on.

Thread safety: plain functions over the directory; the fs tier runs them on its scan thread.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import stat
import threading
import time
from collections import Counter
from collections.abc import Generator, Iterator
from contextlib import closing
from dataclasses import dataclass, field

from kvtier.keys import ChunkKey
from kvtier.tiers.fs.paths import OPEN_FLAGS, NotRegularError, failure_reason, open_level_dir
from kvtier.tiers.shared.lineage import LINK_BYTES, LINK_OFFSET, Link, read_link

#: A temporary file older than this is stale whoever wrote it (a write takes far less).
STALE_TMP_S = 600.0
_KEY_NAME = re.compile(r"[0-9a-f]{64}")
_LEVEL_NAME = re.compile(r"[0-9a-f]{2}")
_TMP_NAME = re.compile(r".*\.([0-9a-f]+)-(\d+)-([0-9a-f]+)-\d+\.tmp")
#: Names this host in temporary files (a dead writer on this host is recognised by its pid).
HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


@dataclass
class ScanResult:
    """What ``scan`` found: chunk files as (mtime, key, size, parent key or ``None``: see
    ``lineage``), stale temporaries removed, and entries skipped by reason (``not_regular``,
    or the errno name of what failed on them)."""

    chunks: list[tuple[float, ChunkKey, int, bytes | None]] = field(default_factory=list)
    stale_removed: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def skip(self, exc: OSError) -> None:
        self.skipped[failure_reason(exc)] += 1


def scan_namespace(namespace_fd: int, own_token: str, stop: threading.Event) -> ScanResult:
    """Every chunk file below the namespace open as ``namespace_fd`` (left open); removes stale
    temporary files on the way (never those of the writer whose tag holds ``own_token``).
    Stops early once ``stop`` is set.

    Follows no link. An entry that cannot be listed, stat'ed or removed, or is not what the
    layout expects there, is skipped and counted (``ScanResult.skipped``); the rest goes on.
    """
    result = ScanResult()
    with closing(_listings(namespace_fd, result)) as listings:
        for directory, entries in listings:
            if stop.is_set():
                break
            for entry in entries:
                _scan_entry(directory, entry, own_token, result)
    return result


def _scan_entry(
    directory: int, entry: os.DirEntry[str], own_token: str, result: ScanResult
) -> None:
    try:
        if _KEY_NAME.fullmatch(entry.name):
            found = entry.stat(follow_symlinks=False)
            if not stat.S_ISREG(found.st_mode):
                raise NotRegularError(entry.path)
            key = ChunkKey(bytes.fromhex(entry.name))
            link = read_file_link(directory, entry.name)
            parent = link.parent if link is not None else None
            result.chunks.append((found.st_mtime, key, found.st_size, parent))
        elif entry.name.endswith(".tmp") and _is_stale(entry, own_token):
            os.unlink(entry.name, dir_fd=directory)
            result.stale_removed += 1
    except FileNotFoundError:
        pass  # removed meanwhile (evicted or renamed by another instance)
    except OSError as exc:
        result.skip(exc)


def read_file_link(directory: int, name: str) -> Link | None:
    """The link chunk file ``name`` (in the directory open as ``directory``) carries; ``None``
    when it has none. Never follows a link or blocks; ``OSError`` when it cannot be read,
    ``NotRegularError`` when it is not a regular file."""
    fd = os.open(name, os.O_RDONLY | OPEN_FLAGS, dir_fd=directory)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularError(name)
        return read_link(os.pread(fd, LINK_BYTES, LINK_OFFSET))
    finally:
        os.close(fd)


def _is_stale(entry: os.DirEntry[str], own_token: str) -> bool:
    match = _TMP_NAME.fullmatch(entry.name)
    if match is not None and match.group(3) == own_token:
        return False
    if time.time() - entry.stat(follow_symlinks=False).st_mtime > STALE_TMP_S:
        return True
    return match is not None and match.group(1) == HOST_TAG and not _pid_alive(int(match[2]))


def _listings(
    namespace_fd: int, result: ScanResult
) -> Generator[tuple[int, list[os.DirEntry[str]]], None, None]:
    """The namespace's descriptor and entries, then each level-2 directory's (real directories
    only, each opened below its parent). A descriptor is open until the next item is asked."""
    top = _entries(namespace_fd, result)
    yield namespace_fd, top
    for level1 in _level_dirs(namespace_fd, top, result):
        try:
            for level2 in _level_dirs(level1, _entries(level1, result), result):
                try:
                    yield level2, _entries(level2, result)
                finally:
                    os.close(level2)
        finally:
            os.close(level1)


def _level_dirs(
    directory: int, entries: list[os.DirEntry[str]], result: ScanResult
) -> Iterator[int]:
    """Descriptors of the level directories among ``entries`` (never through a link); anything
    else at a level's name is counted. The caller closes each."""
    for entry in entries:
        if not _LEVEL_NAME.fullmatch(entry.name):
            continue
        try:
            yield open_level_dir(entry.name, directory)
        except FileNotFoundError:
            pass  # removed meanwhile
        except OSError as exc:
            result.skip(exc)


def _entries(directory: int, result: ScanResult) -> list[os.DirEntry[str]]:
    """The entries of the directory open as ``directory``; none (counted) when it cannot be
    listed."""
    try:
        with os.scandir(directory) as it:
            return list(it)
    except FileNotFoundError:
        return []
    except OSError as exc:
        result.skip(exc)
        return []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
