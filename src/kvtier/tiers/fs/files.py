"""ChunkFiles: the on-disk layout of the filesystem tier and atomic writes (reads: ``reader``).

Layout under ``root_dir``::

    <identity digest hex>/            one namespace per cache identity
        identity.json                 what the digest stands for (human-readable)
        ab/cd/abcd…(64 hex)           one chunk: codec header block (4096 B) + payload
        ab/cd/abcd….<tag>-<n>.tmp     a write in progress; <tag> = host-pid-instance

A chunk is written to a temporary file in its final directory and renamed into place, so a
crash leaves either a complete chunk or none under the final name. Temporary files whose writer
is gone (same host, dead pid; or older than ``STALE_TMP_S``) are removed by ``scan``.

Every entry is reached through ``paths``, below the namespace's descriptor pinned at start
(``pin``): no link below it is followed, no ``open`` can block, and an entry that is not a
regular file raises ``NotRegularError``; a namespace swapped for something else raises
``NamespaceSwappedError`` (one that vanished is made again by the next write). The namespace,
and whether it may be written (read-only on a full disk), is ``namespace``'s.

A chunk file is written in one call of ``native`` (the compiled ``_fastio``: the GIL released
once per file) where it is built; whatever it hands back, and every platform without it, takes
the ``os``-module path (``_write_walk``) under the same rules. Verified reads are ``reader``'s
(``ChunkReader``, as ``reader``), the start-up scan ``scan``'s.

Thread safety: every method may be called from any thread; each thread has its own scratch
buffers (``scratch``).
"""

from __future__ import annotations

import errno
import itertools
import os
import queue
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from kvtier.config.file_modes import DEFAULT_DIR_MODE, file_mode
from kvtier.errors import TierError
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.fs import native
from kvtier.tiers.fs.io import payload_checksum, pwrite_all
from kvtier.tiers.fs.namespace import Namespace
from kvtier.tiers.fs.page_cache import CACHESTAT, PageCacheBudget
from kvtier.tiers.fs.paths import (
    check_regular,
    chunk_dir,
    open_beneath,
    open_level_beneath,
    regular_stat,
    rename_into_place,
)
from kvtier.tiers.fs.pin import NamespacePin, NamespaceSwappedError
from kvtier.tiers.fs.reader import ChunkReader
from kvtier.tiers.fs.scan import HOST_TAG, ScanResult, scan_namespace
from kvtier.tiers.fs.scratch import ThreadScratch
from kvtier.tiers.shared.codec import CHECKSUM_AT, HEADER_BYTES
from kvtier.tiers.shared.lineage import Link, linked
from kvtier.tiers.shared.sealing import ChecksumSealer, Sealer

O_DIRECT: int = getattr(os, "O_DIRECT", 0)
#: The CPUs this process may run on.
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
#: Page-cache writes at once. They are CPU work (a copy, inode and directory updates); more of
#: them than CPUs only queue for the GIL, each of their calls a handoff (issue 17).
BUFFERED_WRITERS = max(2, CPUS)
#: The payload checksum a header is sealed with before ``native.store`` fills in the real one.
_FOLDED = bytes(16)


class ChunkFiles:
    """The chunk files of one cache identity under ``root_dir``.

    Creating it creates the namespace (``directory``; read-only on a full disk, ``TierError``
    if ``root_dir`` cannot be written otherwise). Directories it creates get ``dir_mode``,
    files ``file_mode(dir_mode)`` (``kvtier.config.file_modes``; the umask may narrow both).
    ``o_direct`` is ``"on"`` (``TierError`` if the filesystem refuses it), ``"off"``, or
    ``"auto"``: when a probe write and read succeed and the kernel has ``cachestat``, page cache
    or O_DIRECT chunk by chunk (``adaptive``, see ``page_cache``); O_DIRECT throughout where
    only the probe succeeds. A read-only namespace
    cannot probe, so "auto" reads through the page cache and "on" is trusted. ``sealer``
    seals each chunk and opens it when read (``shared.sealing``; default: the xxh3 checksum).
    """

    def __init__(
        self,
        root_dir: str,
        identity: CacheIdentity,
        *,
        o_direct: str = "auto",
        fsync: bool = False,
        dir_mode: int = DEFAULT_DIR_MODE,
        sealer: Sealer | None = None,
    ) -> None:
        self._digest = identity.digest
        self._sealer = sealer or ChecksumSealer()
        self._fsync = fsync
        self._dir_mode, self._file_mode = dir_mode, file_mode(dir_mode)
        self._token = secrets.token_hex(4)
        self._tag = f"{HOST_TAG}-{os.getpid()}-{self._token}"
        self._seq = itertools.count()
        self._scratch = ThreadScratch()
        self.directory = Namespace(root_dir, identity, self._tag, dir_mode)
        self.namespace = self.directory.path
        if self.directory.read_only:
            self.o_direct = o_direct == "on"
        else:
            self.o_direct = o_direct != "off" and self._direct_io_works()
        if o_direct == "on" and not self.o_direct:
            raise TierError(f"fs tier: o_direct is 'on' but {root_dir} does not allow O_DIRECT")
        #: "auto": page cache or O_DIRECT chunk by chunk (``page_cache``).
        self.adaptive = o_direct == "auto" and self.o_direct and CACHESTAT.available
        self._page_cache = PageCacheBudget()
        self._write_turns: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(BUFFERED_WRITERS):
            self._write_turns.put(None)
        #: This namespace's verified reads (``reader``).
        self.reader = ChunkReader(
            self.directory,
            self._digest,
            self._sealer,
            self._scratch,
            o_direct=self.o_direct,
            adaptive=self.adaptive,
        )
        self._write_flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

    # -- writing ----------------------------------------------------------------------------
    def write(self, key: ChunkKey, region: HostRegion, slot: int, link: Link | None = None) -> int:
        """Store ``slot`` as chunk ``key``, with its ``link`` (``lineage``), atomically; returns
        the file size.

        Replaces a link, FIFO or other non-directory entry at the chunk's path. Raises
        ``OSError``: ``NotRegularError`` when a directory is in the way. At most
        ``BUFFERED_WRITERS`` threads write through the page cache at once; the others wait.
        A namespace that vanished is made again first; ``NamespaceSwappedError`` when another
        entry stands in its place.
        """
        try:
            return self._write_turn(key, region, slot, link)
        except NamespaceSwappedError as exc:
            if not exc.absent or not self.directory.repin():
                raise
        return self._write_turn(key, region, slot, link)

    def _write_turn(self, key: ChunkKey, region: HostRegion, slot: int, link: Link | None) -> int:
        if self._direct_write(HEADER_BYTES + region.slot_bytes):
            return self._write(key, region, slot, link, True)
        self._write_turns.get()
        try:
            return self._write(key, region, slot, link, False)
        finally:
            self._write_turns.put(None)

    def _write(
        self, key: ChunkKey, region: HostRegion, slot: int, link: Link | None, direct: bool
    ) -> int:
        name = key.hex()
        tmp = f"{name}.{self._tag}-{next(self._seq)}.tmp"
        fold = native.usable() and not self._sealer.keyed  # hashed as written, in the call
        buffers, truncate_to = self._file_buffers(key, region, slot, link, direct, fold)
        flags, modes = O_DIRECT if direct else 0, (self._dir_mode, self._file_mode)
        pin, fold_at = self._pin(), CHECKSUM_AT if fold else 0
        if not native.store(
            pin, name, tmp, buffers, truncate_to, flags, self._fsync, modes, fold_at
        ):
            if fold:  # the header still lacks its checksums
                buffers, truncate_to = self._file_buffers(key, region, slot, link, direct, False)
            self._write_walk(pin, name, tmp, buffers, truncate_to, flags)
        return HEADER_BYTES + region.slot_bytes

    def _direct_write(self, nbytes: int) -> bool:
        if not self.o_direct:
            return False
        return not (self.adaptive and self._page_cache.write_buffered(nbytes))

    def _file_buffers(
        self,
        key: ChunkKey,
        region: HostRegion,
        slot: int,
        link: Link | None,
        direct: bool,
        fold: bool,
    ) -> tuple[tuple[memoryview | bytes, memoryview], int]:
        """[header block, payload] of ``slot``'s chunk file, and the size to truncate to (-1:
        none). O_DIRECT writes aligned memory: a scratch header, the slot with its padding. An
        encrypting sealer writes the payload's ciphertext into this thread's scratch body. With
        ``fold`` the header is writable and lacks its checksums (``native.store`` fills them)."""
        payload, aligned = region.view(slot), region.aligned_view(slot)
        if self._sealer.encrypts:
            aligned = self._scratch.body(len(aligned))
            header = self._sealer.seal(self._digest, key, payload, aligned[: len(payload)])
            payload = aligned[: len(payload)]
        else:
            digest = None if self._sealer.keyed else _FOLDED if fold else payload_checksum(payload)
            header = self._sealer.seal(self._digest, key, payload, None, digest)
        header = linked(header, link)
        if not direct:
            return (memoryview(bytearray(header)) if fold else header, payload), -1
        scratch = self._scratch.header()
        scratch[:] = header
        padded = len(aligned) != len(payload)
        return (scratch, aligned), HEADER_BYTES + len(payload) if padded else -1

    def _write_walk(
        self,
        pin: NamespacePin,
        name: str,
        tmp: str,
        buffers: tuple[memoryview | bytes, memoryview],
        truncate_to: int,
        flags: int,
    ) -> None:
        """``native.store`` through the ``os`` module: creates missing level directories and
        names every failure (``OSError``: ``NotRegularError`` when a directory is in the way)."""
        with self._chunk_dir(pin, name, create=True) as directory:
            try:
                fd = os.open(tmp, self._write_flags | flags, self._file_mode, dir_fd=directory)
                try:
                    pwrite_all(fd, buffers)
                    if truncate_to >= 0:
                        os.ftruncate(fd, truncate_to)
                    if self._fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                rename_into_place(directory, tmp, name)
            except BaseException:
                with suppress(OSError):
                    os.unlink(tmp, dir_fd=directory)
                raise
            if self._fsync:
                os.fsync(directory)

    # -- reading ----------------------------------------------------------------------------
    def mark_used(self, key: ChunkKey) -> None:
        """Set chunk ``key``'s mtime to now: what ``kvtier cache`` and a restart's scan take for
        its last use. Raises ``OSError`` (``FileNotFoundError`` when it is gone)."""
        name, pin = key.hex(), self._pin()
        with chunk_dir(pin.fd, name) as directory:
            os.utime(name, dir_fd=directory, follow_symlinks=False)

    def size_of(self, key: ChunkKey) -> int | None:
        """Size of chunk ``key``'s file, ``None`` if there is none.

        Raises ``NotRegularError`` when its path holds something else, or another ``OSError``.
        """
        name = key.hex()
        try:
            pin = self._pin()
            pin.check()
            fd = open_beneath(pin.fd, name, os.O_PATH)
            if fd is not None:
                result = check_regular(fd, name)
                os.close(fd)
                return result.st_size
            with chunk_dir(pin.fd, name) as directory:
                return regular_stat(directory, name).st_size
        except FileNotFoundError:
            return None

    def remove(self, key: ChunkKey) -> bool:
        """Delete chunk ``key``'s entry (whatever it is, unless a directory); never via a link.
        ``False`` when there was none (another instance deleted it first)."""
        name, pin = key.hex(), self._pin()
        pin.check()
        try:
            with chunk_dir(pin.fd, name) as directory:
                os.unlink(name, dir_fd=directory)
        except FileNotFoundError:
            return False
        return True

    def _pin(self) -> NamespacePin:
        """The pinned namespace; ``FileNotFoundError`` while there is none (not made yet)."""
        pin = self.directory.pin
        if pin is None:
            raise FileNotFoundError(errno.ENOENT, "no namespace directory", self.namespace)
        return pin

    @contextmanager
    def _chunk_dir(self, pin: NamespacePin, name: str, *, create: bool = False) -> Iterator[int]:
        """Chunk ``name``'s directory below ``pin`` (checked first): one openat2 when it exists,
        else the walk of ``chunk_dir`` (which creates missing levels with ``create``)."""
        pin.check()
        fd = open_level_beneath(pin.fd, name)
        if fd is None:
            with chunk_dir(pin.fd, name, create=create, mode=self._dir_mode) as walked:
                yield walked
            return
        try:
            yield fd
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the namespace's pinned descriptor; call once no thread uses this any more."""
        self.directory.close()

    # -- start-up ---------------------------------------------------------------------------
    def scan(self, stop: threading.Event) -> ScanResult:
        """Every chunk file in the namespace, stale temporary files removed (``scan``)."""
        pin = self.directory.pin
        if pin is None:
            return ScanResult()
        return scan_namespace(pin.fd, self._token, stop)

    def _direct_io_works(self) -> bool:
        pin = self.directory.pin
        if not O_DIRECT or pin is None:
            return False
        name, block = f".o_direct-probe.{self._tag}-0.tmp", self._scratch.header()
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | O_DIRECT
        try:
            fd = os.open(name, flags, self._file_mode, dir_fd=pin.fd)
            try:
                return os.pwrite(fd, block, 0) == len(block) == os.preadv(fd, [block], 0)
            finally:
                os.close(fd)
        except OSError:
            return False
        finally:
            with suppress(OSError):
                os.unlink(name, dir_fd=pin.fd)
