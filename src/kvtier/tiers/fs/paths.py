"""Reaching entries under the filesystem tier's namespace without following a link or blocking.

The chunk of key hex ``abcd…`` lives in ``<namespace>/ab/cd/abcd…``. Whoever can write under
``root_dir`` may leave anything at such a path: a FIFO (whose ``open`` waits for a writer,
forever), a socket, a device, a directory, a symlink out of the root or into a loop. So:

* the two level directories are opened one at a time with ``O_NOFOLLOW`` and ``O_DIRECTORY``,
  each below the previous through ``dir_fd``, and every file operation runs relative to the
  last one: no link below the namespace is ever followed;
* a chunk file is opened with ``O_NONBLOCK | O_NOFOLLOW`` (a FIFO opens at once, a link fails)
  and checked to be regular with ``fstat`` before a byte is read.

Every walk starts from the namespace's descriptor, pinned at start (``pin``): whatever stands at
the namespace's path later is never followed. ``open_beneath`` does the same walk in one
``openat2`` call with ``RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH`` (Linux 5.6+) from that
descriptor: one syscall instead of five
(each one a GIL round trip, which is what small chunks pay for under many threads). Where
``openat2`` is missing (``ENOSYS``, ``EPERM`` from a seccomp filter) it says so once and callers
take the walk above; any error other than "absent" is left to the walk to name exactly.

An entry that is not what the layout expects there (a regular file, or a real directory for a
level) raises ``NotRegularError``; the tier counts it under the reason ``not_regular`` and
treats the key as absent. ``root_dir`` and the namespace directory itself may be links (the
operator's choice of where the cache lives); they are followed once, at start, nothing below
them ever is.

Thread safety: plain functions over descriptors they open and close; any thread.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from kvtier.config.file_modes import DEFAULT_DIR_MODE

_LEVEL_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
O_PATH: int = getattr(os, "O_PATH", 0)
#: Added to every chunk file open: never wait (FIFO), never follow, never take a terminal.
OPEN_FLAGS = os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


#: openat2(2): the same number on every Linux architecture; ``struct open_how`` and its flag.
_SYS_OPENAT2 = 437
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_AT_FDCWD = -100


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def libc_function(name: str) -> Any:
    """libc's function ``name`` (``ctypes.get_errno`` kept), ``None`` off Linux or if missing.

    Calls through ctypes release the GIL, as any I/O call should.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None


def load_syscall(*argtypes: Any) -> Any:
    """libc's ``syscall`` typed as ``(number, *argtypes) -> long``; ``None`` off Linux."""
    fn = libc_function("syscall")
    if fn is None:
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, *argtypes]
    return fn


class Openat2:
    """``openat2`` with ``RESOLVE_NO_SYMLINKS``: no link anywhere in the path is followed.

    ``available`` turns false at the first ``ENOSYS``/``EPERM`` (old kernel, seccomp).
    Thread safety: any thread (the flag only ever goes from true to false).
    """

    def __init__(self) -> None:
        self._syscall = load_syscall(
            ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t
        )
        self.available = self._syscall is not None

    def open(self, path: str, flags: int, mode: int = 0, dir_fd: int = _AT_FDCWD) -> int | None:
        """A descriptor of ``path`` (below ``dir_fd``, never out of it, when given); ``None``
        when openat2 is not available; raises ``OSError``."""
        if self._syscall is None or not self.available:
            return None
        resolve = _RESOLVE_NO_SYMLINKS | (_RESOLVE_BENEATH if dir_fd != _AT_FDCWD else 0)
        how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
        encoded = os.fsencode(path)
        fd = self._syscall(_SYS_OPENAT2, dir_fd, encoded, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EPERM):
            self.available = False
            return None
        raise OSError(code, os.strerror(code), path)


#: The process's ``openat2`` (shared: whether the kernel has it is the same for everyone).
OPENAT2 = Openat2()


def level_path(name: str) -> str:
    """``<name[:2]>/<name[2:4]>``: the directory of chunk ``name`` below the namespace."""
    return f"{name[:2]}/{name[2:4]}"


def open_beneath(namespace_fd: int, name: str, flags: int) -> int | None:
    """Open chunk ``name``'s file (``flags | OPEN_FLAGS``) below the namespace open as
    ``namespace_fd``, following no link at all.

    ``None`` when openat2 is unavailable or failed for another reason than absence (the caller
    then walks with ``chunk_dir``, which names the failure); raises ``FileNotFoundError``.
    """
    # openat2 refuses O_PATH with any flag but O_NOFOLLOW, O_DIRECTORY, O_CLOEXEC (EINVAL):
    # O_PATH opens nothing, so none of the others is needed.
    extra = os.O_NOFOLLOW if flags & O_PATH else OPEN_FLAGS
    try:
        path = f"{level_path(name)}/{name}"
        return OPENAT2.open(path, flags | extra, dir_fd=namespace_fd)
    except FileNotFoundError:
        raise
    except OSError:
        return None


def open_level_beneath(namespace_fd: int, name: str) -> int | None:
    """A descriptor of chunk ``name``'s directory following no link, or ``None`` (see above)."""
    try:
        return OPENAT2.open(level_path(name), _LEVEL_FLAGS, dir_fd=namespace_fd)
    except OSError:
        return None


class NotRegularError(OSError):
    """An entry is not a regular file (or, where a level directory belongs, not a directory)."""

    reason = "not_regular"

    def __init__(self, name: str) -> None:
        super().__init__(f"{name}: not a regular file or directory")


def failure_reason(exc: OSError) -> str:
    """The counter suffix for ``exc``: its ``reason`` (``not_regular``, ``namespace_swapped``)
    or the errno name (``ENOSPC``...)."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str):
        return reason
    return errno.errorcode.get(exc.errno or 0, "unknown")


@contextmanager
def chunk_dir(
    namespace_fd: int, name: str, *, create: bool = False, mode: int = DEFAULT_DIR_MODE
) -> Iterator[int]:
    """A descriptor of ``<name[:2]>/<name[2:4]>`` below the namespace open as ``namespace_fd``,
    closed when the block ends (``namespace_fd`` is left open).

    With ``create``, missing directories are made with ``mode`` (less the umask). Raises
    ``FileNotFoundError`` when one is missing (without ``create``), ``NotRegularError`` when a
    level is a link or not a directory.
    """
    fd = _open_dir(name[:2], namespace_fd, create, mode)
    try:
        child = _open_dir(name[2:4], fd, create, mode)
        os.close(fd)
        fd = child
        yield fd
    finally:
        os.close(fd)


def _open_dir(name: str, dir_fd: int, create: bool, mode: int) -> int:
    """Open level ``name`` below ``dir_fd`` (never through a link), made where missing."""
    try:
        return open_level_dir(name, dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    with suppress(FileExistsError):  # another thread or instance made it meanwhile
        os.mkdir(name, mode, dir_fd=dir_fd)
    return open_level_dir(name, dir_fd)


def open_level_dir(name: str, dir_fd: int) -> int:
    """Open directory ``name`` below ``dir_fd``; ``NotRegularError`` if a link or not a dir."""
    try:
        return os.open(name, _LEVEL_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a link, or a file where a dir belongs
            raise NotRegularError(name) from exc
        raise


def regular_stat(dir_fd: int, name: str) -> os.stat_result:
    """``lstat`` of ``name`` in ``dir_fd``; ``NotRegularError`` unless it is a regular file."""
    result = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISREG(result.st_mode):
        raise NotRegularError(name)
    return result


def check_regular(fd: int, name: str) -> os.stat_result:
    """``fstat`` of an open ``fd``; closes it and raises ``NotRegularError`` unless regular."""
    result = os.fstat(fd)
    if not stat.S_ISREG(result.st_mode):
        os.close(fd)
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
    return fd, check_regular(fd, name)


def rename_into_place(dir_fd: int, tmp: str, name: str) -> None:
    """Rename ``tmp`` to ``name`` in ``dir_fd``, replacing whatever non-directory was there.

    A link at ``name`` is replaced, never followed; a directory there is a ``NotRegularError``.
    """
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except IsADirectoryError as exc:
        raise NotRegularError(name) from exc


def unlink_if_same(dir_fd: int, name: str, seen: tuple[int, int]) -> None:
    """Delete ``name`` unless another writer replaced it since it was ``seen`` (its st_dev,
    st_ino); never raises."""
    with suppress(OSError):
        now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == seen:
            os.unlink(name, dir_fd=dir_fd)
