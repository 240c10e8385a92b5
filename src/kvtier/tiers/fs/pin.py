"""The namespace directory pinned at start: every chunk file is reached below its descriptor.

``root_dir/<identity digest hex>`` is opened once (``O_DIRECTORY``; a link there is followed
at that moment only: the operator's choice of where the cache lives) and that descriptor is
kept. Every chunk-file operation runs relative to it (``dir_fd``, ``openat2`` with
``RESOLVE_BENEATH``), so whatever later stands at the namespace's path (a symlink out of the
root, another directory) is never followed: a swap cannot send a write or a read elsewhere.

A swap is also refused. Before each operation the path's ``lstat`` must still give the
``(st_dev, st_ino)`` it gave at start (the compiled path checks it in the same call that then
does the I/O). When it does not, the operation raises ``NamespaceSwappedError``: a store fails
(``store_failed.namespace_swapped``), a load or probe is a miss (``load_failed.`` /
``probe_failed.namespace_swapped``), and one warning is logged. Putting the directory back
lifts it. A namespace that is gone (the cache wiped while running) is ``absent``: the next
store makes it again and pins the new one (``Namespace.repin``).

The one window left: an operation whose check passed just before the swap still runs in the
pinned directory, wherever the swap moved it (a moved directory keeps its inode); it never
lands in a link's target.

Thread safety: a pin never changes; any thread may use one. A replaced pin's descriptor stays
open until the tier closes (another thread may still be using it).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from dataclasses import dataclass, field
from functools import cached_property

log = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC


class NamespaceSwappedError(OSError):
    """The namespace's path no longer names the directory pinned at start (``absent``: nothing
    is there now)."""

    reason = "namespace_swapped"

    def __init__(self, path: str, absent: bool = False) -> None:
        what = "is gone" if absent else "was replaced since start; not followed"
        super().__init__(errno.ESTALE, f"namespace {what}", path)
        self.absent = absent


@dataclass(frozen=True)
class NamespacePin:
    """The namespace at ``path``: its descriptor ``fd`` and the ``(st_dev, st_ino)`` of the
    entry at ``path`` (the link's own, where the operator made it a link)."""

    path: str
    fd: int
    entry: tuple[int, int]
    _warned: list[bool] = field(default_factory=lambda: [False], compare=False, repr=False)

    @classmethod
    def open(cls, path: str, follow: bool = True) -> NamespacePin:
        """Pin the directory at ``path`` (a link there followed only with ``follow``); raises
        ``NamespaceSwappedError`` when a link is not followed, else ``OSError``."""
        try:
            fd = os.open(path, _DIR_FLAGS if follow else _DIR_FLAGS | os.O_NOFOLLOW)
        except OSError as exc:
            if not follow and exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise NamespaceSwappedError(path) from exc
            raise
        try:
            entry = os.stat(path, follow_symlinks=False)
            opened = os.fstat(fd)
            if stat.S_ISDIR(entry.st_mode) and _identity(entry) != _identity(opened):
                raise NamespaceSwappedError(path)  # swapped between the open and the lstat
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, _identity(entry))

    @cached_property
    def native(self) -> tuple[int, bytes, int, int]:
        """The pin as the compiled path takes it: descriptor, path, st_dev, st_ino."""
        return self.fd, os.fsencode(self.path), *self.entry

    def check(self) -> None:
        """Raise ``NamespaceSwappedError`` unless ``path`` still names the pinned entry."""
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            self._refuse(absent=True)
        except OSError:
            self._refuse(absent=False)  # ENOTDIR: a file where root_dir was, ...
        else:
            if _identity(now) != self.entry:
                self._refuse(absent=False)

    def close(self) -> None:
        os.close(self.fd)

    def _refuse(self, absent: bool) -> None:
        if not self._warned[0]:
            self._warned[0] = True
            log.warning(
                "fs tier: %s %s: chunk files are not read or written there",
                self.path,
                "is gone" if absent else "is no longer the directory opened at start",
            )
        raise NamespaceSwappedError(self.path, absent)


def _identity(found: os.stat_result) -> tuple[int, int]:
    return found.st_dev, found.st_ino
