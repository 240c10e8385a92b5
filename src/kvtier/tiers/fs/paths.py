"""Reaching entries under the filesystem tier's namespace without following a link or blocking.

The chunk of key hex ``abcd…`` lives in ``<namespace>/ab/cd/abcd…``. Whoever can write under
``root_dir`` may leave anything at such a path: a FIFO (whose ``open`` waits for a writer,
forever), a socket, a device, a directory, a symlink out of the root or into a loop. So:

* the two level directories are opened one at a time with ``O_NOFOLLOW`` and ``O_DIRECTORY``,
  each below the previous through ``dir_fd``, and every file operation runs relative to the
  last one: no link below the namespace is ever followed;
* a chunk file is opened with ``O_NONBLOCK | O_NOFOLLOW`` (a FIFO opens at once, a link fails)
  and checked to be regular with ``fstat`` before a byte is read.

An entry that is not what the layout expects there (a regular file, or a real directory for a
level) raises ``NotRegularError``; the tier counts it under the reason ``not_regular`` and
treats the key as absent. ``root_dir`` and the namespace directory itself may be links (the
operator's choice of where the cache lives); they are followed, nothing below them is.

Thread safety: plain functions over descriptors they open and close; any thread.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress

_NAMESPACE_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC
_LEVEL_FLAGS = _NAMESPACE_FLAGS | os.O_NOFOLLOW
#: Added to every chunk file open: never wait (FIFO), never follow, never take a terminal.
OPEN_FLAGS = os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


class NotRegularError(OSError):
    """An entry is not a regular file (or, where a level directory belongs, not a directory)."""

    reason = "not_regular"

    def __init__(self, name: str) -> None:
        super().__init__(f"{name}: not a regular file or directory")


def failure_reason(exc: OSError) -> str:
    """The counter suffix for ``exc``: ``not_regular`` or the errno name (``ENOSPC``...)."""
    if isinstance(exc, NotRegularError):
        return exc.reason
    return errno.errorcode.get(exc.errno or 0, "unknown")


@contextmanager
def chunk_dir(namespace: str, name: str, *, create: bool = False) -> Iterator[int]:
    """A descriptor of ``<namespace>/<name[:2]>/<name[2:4]>``, closed when the block ends.

    With ``create``, missing directories are made. Raises ``FileNotFoundError`` when one is
    missing (without ``create``), ``NotRegularError`` when a level is a link or not a directory.
    """
    fd = _open_dir(namespace, None, create)
    try:
        for level in (name[:2], name[2:4]):
            child = _open_dir(level, fd, create)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open_dir(path: str, dir_fd: int | None, create: bool) -> int:
    """Open the namespace (``dir_fd`` None: path followed) or a level below ``dir_fd``."""
    try:
        return _open_real_dir(path, dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    with suppress(FileExistsError):  # another thread or instance made it meanwhile
        if dir_fd is None:
            os.makedirs(path, exist_ok=True)
        else:
            os.mkdir(path, dir_fd=dir_fd)
    return _open_real_dir(path, dir_fd)


def _open_real_dir(path: str, dir_fd: int | None) -> int:
    flags = _NAMESPACE_FLAGS if dir_fd is None else _LEVEL_FLAGS
    try:
        return os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a link, or a file where a dir belongs
            raise NotRegularError(path) from exc
        raise


def regular_stat(dir_fd: int, name: str) -> os.stat_result:
    """``lstat`` of ``name`` in ``dir_fd``; ``NotRegularError`` unless it is a regular file."""
    result = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISREG(result.st_mode):
        raise NotRegularError(name)
    return result


def open_regular(dir_fd: int, name: str, flags: int) -> tuple[int, os.stat_result]:
    """Open regular file ``name`` in ``dir_fd`` (``flags | OPEN_FLAGS``): descriptor, fstat.

    Never blocks and never follows a link. Raises ``FileNotFoundError`` when it is absent,
    ``NotRegularError`` when it is not a regular file, ``OSError`` when it cannot be opened.
    """
    try:
        fd = os.open(name, flags | OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            regular_stat(dir_fd, name)  # says NotRegularError when that is why open failed
        raise
    result = os.fstat(fd)
    if not stat.S_ISREG(result.st_mode):
        os.close(fd)
        raise NotRegularError(name)
    return fd, result


def rename_into_place(dir_fd: int, tmp: str, name: str) -> None:
    """Rename ``tmp`` to ``name`` in ``dir_fd``, replacing whatever non-directory was there.

    A link at ``name`` is replaced, never followed; a directory there is a ``NotRegularError``.
    """
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except IsADirectoryError as exc:
        raise NotRegularError(name) from exc


def unlink_if_same(dir_fd: int, name: str, seen: os.stat_result) -> None:
    """Delete ``name`` unless another writer replaced it since ``seen``; never raises."""
    with suppress(OSError):
        now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (seen.st_dev, seen.st_ino):
            os.unlink(name, dir_fd=dir_fd)
