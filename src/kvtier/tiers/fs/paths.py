"""Reaching entries under the filesystem tier's namespace without following a link or blocking.

The chunk of key hex ``abcd…`` lives in ``<namespace>/ab/cd/abcd…``. Whoever can write under
``root_dir`` may leave anything at such a path: a FIFO (whose ``open`` waits for a writer,
forever), a socket, a device, a directory, a symlink out of the root or into a loop. So:

* the two level directories are opened one at a time with ``O_NOFOLLOW`` and ``O_DIRECTORY``,
  each below the previous through ``dir_fd``, and every file operation runs relative to the
  last one: no link below the namespace is ever followed;
* a chunk file is opened with ``O_NONBLOCK | O_NOFOLLOW`` (a FIFO opens at once, a link fails)
  and checked to be regular with ``fstat`` before a byte is read.

``open_beneath`` does the same walk in one ``openat2`` call with ``RESOLVE_NO_SYMLINKS`` (Linux
5.6+) from the namespace's real path, resolved once at start: one syscall instead of five
(each one a GIL round trip, which is what small chunks pay for under many threads). Where
``openat2`` is missing (``ENOSYS``, ``EPERM`` from a seccomp filter) it says so once and callers
take the walk above; any error other than "absent" is left to the walk to name exactly.

An entry that is not what the layout expects there (a regular file, or a real directory for a
level) raises ``NotRegularError``; the tier counts it under the reason ``not_regular`` and
treats the key as absent. ``root_dir`` and the namespace directory itself may be links (the
operator's choice of where the cache lives); they are followed, nothing below them is.

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

from kvtier.config.file_modes import DEFAULT_DIR_MODE, make_dirs

_NAMESPACE_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC
_LEVEL_FLAGS = _NAMESPACE_FLAGS | os.O_NOFOLLOW
#: Added to every chunk file open: never wait (FIFO), never follow, never take a terminal.
OPEN_FLAGS = os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


#: openat2(2): the same number on every Linux architecture; ``struct open_how`` and its flag.
_SYS_OPENAT2 = 437
_RESOLVE_NO_SYMLINKS = 0x04
_AT_FDCWD = -100


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def load_syscall(*argtypes: Any) -> Any:
    """libc's ``syscall`` typed as ``(number, *argtypes) -> long``; ``None`` off Linux.

    Calls through ctypes release the GIL, as any I/O call should.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
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

    def open(self, path: str, flags: int, mode: int = 0) -> int | None:
        """A descriptor of ``path``; ``None`` when openat2 is not available; raises ``OSError``."""
        if self._syscall is None or not self.available:
            return None
        how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE_NO_SYMLINKS)
        encoded = os.fsencode(path)
        fd = self._syscall(_SYS_OPENAT2, _AT_FDCWD, encoded, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EPERM):
            self.available = False
            return None
        raise OSError(code, os.strerror(code), path)


#: The process's ``openat2`` (shared: whether the kernel has it is the same for everyone).
OPENAT2 = Openat2()


def level_path(real_namespace: str, name: str) -> str:
    """``<namespace>/<name[:2]>/<name[2:4]>``: the directory of chunk ``name``."""
    return f"{real_namespace}/{name[:2]}/{name[2:4]}"


def open_beneath(real_namespace: str, name: str, flags: int) -> int | None:
    """Open chunk ``name``'s file (``flags | OPEN_FLAGS``) following no link at all.

    ``None`` when openat2 is unavailable or failed for another reason than absence (the caller
    then walks with ``chunk_dir``, which names the failure); raises ``FileNotFoundError``.
    """
    try:
        return OPENAT2.open(f"{level_path(real_namespace, name)}/{name}", flags | OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError:
        return None


def open_level_beneath(real_namespace: str, name: str) -> int | None:
    """A descriptor of chunk ``name``'s directory following no link, or ``None`` (see above)."""
    try:
        return OPENAT2.open(level_path(real_namespace, name), _LEVEL_FLAGS)
    except OSError:
        return None


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
def chunk_dir(
    namespace: str, name: str, *, create: bool = False, mode: int = DEFAULT_DIR_MODE
) -> Iterator[int]:
    """A descriptor of ``<namespace>/<name[:2]>/<name[2:4]>``, closed when the block ends.

    With ``create``, missing directories are made with ``mode`` (less the umask). Raises
    ``FileNotFoundError`` when one is missing (without ``create``), ``NotRegularError`` when a
    level is a link or not a directory.
    """
    fd = _open_dir(namespace, None, create, mode)
    try:
        for level in (name[:2], name[2:4]):
            child = _open_dir(level, fd, create, mode)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _open_dir(path: str, dir_fd: int | None, create: bool, mode: int) -> int:
    """Open the namespace (``dir_fd`` None: path followed) or a level below ``dir_fd``."""
    try:
        return _open_real_dir(path, dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    with suppress(FileExistsError):  # another thread or instance made it meanwhile
        if dir_fd is None:
            make_dirs(path, mode)
        else:
            os.mkdir(path, mode, dir_fd=dir_fd)
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
