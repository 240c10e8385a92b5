"""The namespace directory of one cache identity, and whether the filesystem tier may write.

At start the namespace ``<root_dir>/<identity digest hex>`` is created with its
``identity.json``. On a full or read-only filesystem (``ENOSPC``, ``EDQUOT``, ``EROFS``) that
write fails: the namespace is then *read-only*. The chunks already there are served, stores
fail, and ``may_write`` tries the write again at most every ``READ_ONLY_RETRY_S`` seconds, so
the tier writes again once there is room. Any other failure (``root_dir`` is a file, no
permission) is a ``TierError`` at start: that is a wrong ``root_dir``, not a full disk.

The namespace is pinned (``pin``) once it exists: its descriptor is held and every file of
it is reached below that descriptor. A namespace that vanished while running is made and pinned
again by ``repin`` (the next store's); one replaced by something else is refused.

``SpaceGuard`` keeps ``min_free_bytes`` free on the filesystem while the tier writes.

Thread safety: ``Namespace`` is built on the caller's thread (the manager's); ``may_write`` and
every ``SpaceGuard`` method run on the tier's write threads, each under its instance's lock.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from contextlib import suppress

from kvtier.config.file_modes import DEFAULT_DIR_MODE, file_mode, make_dirs, open_to_others
from kvtier.errors import TierError
from kvtier.identity import CacheIdentity
from kvtier.tiers.fs.pin import NamespacePin, NamespaceSwappedError
from kvtier.tiers.shared.codec import FORMAT_VERSION

log = logging.getLogger(__name__)

#: A read-only namespace tries to write again at most this often (read at each try).
READ_ONLY_RETRY_S = 5.0
#: Errors that say "no room, or no writes, on this filesystem" rather than "wrong root_dir".
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
#: How long the pin of a namespace that vanished stays open after its replacement: a thread
#: that took it just before may still be about to use its descriptor. Every use checks the pin
#: first (gone: ``ESTALE``), and a chunk read below a reused descriptor would still have to
#: verify as its key, so the grace only keeps such a read from failing for nothing. Closed
#: then at the next replacement, or at ``close``: a cache wiped daily for months holds one or
#: two descriptors, not one per wipe.
REPLACED_PIN_GRACE_S = 60.0


def describe(identity: CacheIdentity) -> str:
    """The human-readable ``identity.json`` of ``identity``'s namespace."""
    description = {
        "format": "kvtier-fs",
        "format_version": FORMAT_VERSION,
        "digest": identity.hexdigest,
        "identity": identity.describe(),
    }
    return json.dumps(description, indent=2, sort_keys=True)


def write_description(namespace_fd: int, text: str, tag: str, dir_mode: int) -> None:
    """Write ``text`` as the ``identity.json`` of the namespace open as ``namespace_fd``
    (``file_mode(dir_mode)``), atomically.

    Raises ``OSError``; leaves no temporary file behind.
    """
    tmp = f"identity.json.{tag}-0.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, file_mode(dir_mode), dir_fd=namespace_fd)
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.rename(tmp, "identity.json", src_dir_fd=namespace_fd, dst_dir_fd=namespace_fd)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp, dir_fd=namespace_fd)
        raise


class Namespace:
    """The directory of one identity's chunks; ``read_only`` while it cannot be written.

    Directories it creates (``root_dir`` and parents where missing, the namespace) get
    ``dir_mode``. ``error`` is the write failure that made it read-only at start (``None`` if
    writable). Raises ``TierError`` at start when ``root_dir`` cannot be written for another
    reason.
    """

    def __init__(
        self, root_dir: str, identity: CacheIdentity, tag: str, dir_mode: int = DEFAULT_DIR_MODE
    ) -> None:
        self.path = os.path.join(os.path.abspath(root_dir), identity.hexdigest)
        self.dir_mode = dir_mode
        #: The namespace held open (``None`` while it does not exist: a full disk at start).
        self.pin: NamespacePin | None = None
        self._replaced: list[tuple[float, NamespacePin]] = []  # (when replaced, pin)
        self._followed = False  # only the first pin follows a link at the namespace
        self._text = describe(identity)
        self._tag = tag
        self._lock = threading.Lock()
        self._last_try = time.monotonic()
        self.error = self._write()
        if self.error is not None and self.error.errno not in FULL_ERRNOS:
            self.close()
            reason = self.error.strerror or self.error
            raise TierError(
                f"fs tier: cannot write under root_dir {root_dir!r}: {reason}"
            ) from self.error
        self.read_only = self.error is not None

    def may_write(self) -> bool:
        """Whether a store may go ahead; a read-only namespace retries its write first.

        The retry runs at most every ``READ_ONLY_RETRY_S`` seconds, on the calling thread.
        """
        if not self.read_only:
            return True
        with self._lock:
            if self.read_only and time.monotonic() - self._last_try >= READ_ONLY_RETRY_S:
                self._last_try = time.monotonic()
                self.read_only = self._write() is not None
                if not self.read_only:
                    log.info("%s can be written again: stores resume", self.path)
            return not self.read_only

    def repin(self) -> bool:
        """Make the namespace again if it is gone (the cache wiped while running) and pin it;
        whether a pinned namespace stands at ``path`` now. Any thread."""
        with self._lock:
            return self._write() is None

    def statvfs(self) -> os.statvfs_result:
        """``statvfs`` of the pinned namespace (of its path while there is none)."""
        pin = self.pin
        return os.statvfs(self.path if pin is None else pin.fd)

    def close(self) -> None:
        """Close the pinned descriptors (when no thread uses them any more)."""
        for pin in (*(p for _, p in self._replaced), *([self.pin] if self.pin else [])):
            with suppress(OSError):
                pin.close()
        self._replaced.clear()
        self.pin = None

    def _write(self) -> OSError | None:
        try:
            pin = self._pinned()
            write_description(pin.fd, self._text, self._tag, self.dir_mode)
        except OSError as exc:
            return exc
        return None

    def _pinned(self) -> NamespacePin:
        """The pin, made (the directory too, where missing) when there is none or the pinned
        namespace is gone; raises ``NamespaceSwappedError`` when something else stands there."""
        pin = self.pin
        if pin is not None:
            try:
                pin.check()
                return pin
            except NamespaceSwappedError as exc:
                if not exc.absent:
                    raise
            self._retire(pin)
            self.pin = None
        make_dirs(self.path, self.dir_mode)
        # Only the first pin follows a link at the namespace (the operator's, at start).
        self.pin = NamespacePin.open(self.path, follow=not self._followed)
        self._followed = True
        return self.pin

    def _retire(self, pin: NamespacePin) -> None:
        """Keep ``pin`` open for ``REPLACED_PIN_GRACE_S``; close those replaced before that."""
        now, kept = time.monotonic(), []
        for replaced_at, old in self._replaced:
            if now - replaced_at < REPLACED_PIN_GRACE_S:
                kept.append((replaced_at, old))
            else:
                with suppress(OSError):
                    old.close()
        self._replaced = [*kept, (now, pin)]


class SpaceGuard:
    """Refuses writes that would leave less than ``min_free_bytes`` free on the filesystem.

    ``statvfs`` is asked at most every ``interval_s`` seconds; bytes written in between are
    subtracted from its last answer. Thread safety: every method takes ``_lock``.
    """

    def __init__(self, directory: Namespace, min_free_bytes: int, interval_s: float = 0.25) -> None:
        self._directory = directory
        self._min_free = min_free_bytes
        self._interval_s = interval_s
        self._free = 0
        self._next_check = 0.0
        self._lock = threading.Lock()

    def allows(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more may be written. Raises ``OSError`` if statvfs fails."""
        if self._min_free == 0:
            return True
        with self._lock:
            now = time.monotonic()
            if now >= self._next_check:
                stat = self._directory.statvfs()
                self._free = stat.f_bavail * stat.f_frsize
                self._next_check = now + self._interval_s
            return self._free - nbytes >= self._min_free

    def wrote(self, nbytes: int) -> None:
        with self._lock:
            self._free -= nbytes


def warn_if_open(root_dir: str, namespace: str, dir_mode: int) -> None:
    """One warning per directory of the cache more open than ``dir_mode`` (chunks hold prompt
    content); kvtier leaves the mode of directories it did not create alone."""
    for path in (root_dir, namespace):
        problem = open_to_others(path, dir_mode)
        if problem:
            log.warning(
                "fs tier: %s: %s; chunks hold prompt content: chmod %o it, or set dir_mode",
                path,
                problem,
                dir_mode,
            )


def warn_if_read_only(tier: str, directory: Namespace) -> None:
    """One warning when ``directory`` started read-only (a full or read-only filesystem)."""
    error = directory.error
    if error is not None:
        log.warning(
            "%s: cannot write under %s (%s): starting read-only. The chunks there are served; "
            "stores fail (store_failed.read_only) until it can be written again",
            tier,
            directory.path,
            error.strerror or error,
        )
