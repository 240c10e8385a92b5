"""ChunkFiles: the on-disk layout of the filesystem tier, atomic writes and verified reads.

Layout under ``root_dir``::

    <identity digest hex>/            one namespace per cache identity
        identity.json                 what the digest stands for (human-readable)
        ab/cd/abcd…(64 hex)           one chunk: codec header block (4096 B) + payload
        ab/cd/abcd….<tag>-<n>.tmp     a write in progress; <tag> = host-pid-instance

A chunk is written to a temporary file in its final directory and renamed into place, so a
crash leaves either a complete chunk or none under the final name. Temporary files whose writer
is gone (same host, dead pid; or older than ``STALE_TMP_S``) are removed by ``scan``.

Every entry is reached through ``fs_paths``: no link below the namespace is followed and no
``open`` can block; an entry that is not a regular file raises ``NotRegularError``. The
namespace, and whether it may be written (read-only on a full disk), is ``fs_namespace``'s.

Thread safety: every method may be called from any thread; per-thread scratch buffers live in
a ``threading.local``.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import mmap
import os
import queue
import re
import secrets
import socket
import stat
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from kvtier.errors import IntegrityError, TierError
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.fs.cache_policy import CACHESTAT, PageCachePolicy
from kvtier.tiers.fs.io import payload_checksum, pwrite_all, read_chunk
from kvtier.tiers.fs.namespace import Namespace
from kvtier.tiers.fs.paths import (
    NotRegularError,
    check_regular,
    chunk_dir,
    failure_reason,
    open_beneath,
    open_level_beneath,
    open_regular,
    regular_stat,
    rename_into_place,
    unlink_if_same,
)
from kvtier.tiers.shared.codec import HEADER_BYTES, encode_header, verify

#: A temporary file older than this is stale whoever wrote it (a write takes far less).
STALE_TMP_S = 600.0
O_DIRECT: int = getattr(os, "O_DIRECT", 0)
#: Page-cache writes at once. They are CPU work (a copy, inode and directory updates); more of
#: them than CPUs only queue for the GIL, each of their calls a handoff (issue 17).
BUFFERED_WRITERS = max(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2)
_KEY_NAME = re.compile(r"[0-9a-f]{64}")
_LEVEL_NAME = re.compile(r"[0-9a-f]{2}")
_TMP_NAME = re.compile(r".*\.([0-9a-f]+)-(\d+)-([0-9a-f]+)-\d+\.tmp")
#: Names this host in temporary files (a dead writer on this host is recognised by its pid).
HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


@dataclass
class ScanResult:
    """What ``scan`` found: chunk files as (mtime, key, size), stale temporaries removed, and
    entries skipped by reason (``not_regular``, or the errno name of what failed on them)."""

    chunks: list[tuple[float, ChunkKey, int]] = field(default_factory=list)
    stale_removed: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def skip(self, exc: OSError) -> None:
        self.skipped[failure_reason(exc)] += 1


class ChunkFiles:
    """The chunk files of one cache identity under ``root_dir``.

    Creating it creates the namespace (``directory``; read-only on a full disk, ``TierError``
    if ``root_dir`` cannot be written otherwise). ``o_direct`` is ``"on"`` (``TierError`` if
    the filesystem refuses it), ``"off"``, or ``"auto"``: when a probe write and read succeed
    and the kernel has ``cachestat``, page cache or O_DIRECT chunk by chunk (``adaptive``, see
    ``cache_policy``); O_DIRECT throughout where only the probe succeeds. A read-only namespace
    cannot probe, so "auto" reads through the page cache and "on" is trusted.
    """

    def __init__(
        self, root_dir: str, identity: CacheIdentity, *, o_direct: str = "auto", fsync: bool = False
    ) -> None:
        self._digest = identity.digest
        self._fsync = fsync
        self._token = secrets.token_hex(4)
        self._tag = f"{HOST_TAG}-{os.getpid()}-{self._token}"
        self._seq = itertools.count()
        self._local = threading.local()
        self.directory = Namespace(root_dir, identity, self._tag)
        self.namespace = self.directory.path
        #: Links in root_dir's own path are resolved once, here; none below it is followed.
        self._real = os.path.realpath(self.namespace)
        if self.directory.read_only:
            self.o_direct = o_direct == "on"
        else:
            self.o_direct = o_direct != "off" and self._direct_io_works()
        if o_direct == "on" and not self.o_direct:
            raise TierError(f"fs tier: o_direct is 'on' but {root_dir} does not allow O_DIRECT")
        #: "auto": page cache or O_DIRECT chunk by chunk (``cache_policy``).
        self.adaptive = o_direct == "auto" and self.o_direct and CACHESTAT.available
        self._policy = PageCachePolicy()
        self._write_turns: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(BUFFERED_WRITERS):
            self._write_turns.put(None)
        direct = O_DIRECT if self.o_direct and not self.adaptive else 0
        self._read_flags = os.O_RDONLY | direct
        self._write_flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW

    # -- writing ----------------------------------------------------------------------------
    def write(self, key: ChunkKey, region: HostRegion, slot: int) -> int:
        """Store ``slot`` as chunk ``key``, atomically; returns the file size.

        Replaces a link, FIFO or other non-directory entry at the chunk's path. Raises
        ``OSError``: ``NotRegularError`` when a directory is in the way. At most
        ``BUFFERED_WRITERS`` threads write through the page cache at once; the others wait.
        """
        if self._direct_write(HEADER_BYTES + region.slot_bytes):
            return self._write(key, region, slot, True)
        self._write_turns.get()
        try:
            return self._write(key, region, slot, False)
        finally:
            self._write_turns.put(None)

    def _write(self, key: ChunkKey, region: HostRegion, slot: int, direct: bool) -> int:
        name = key.hex()
        tmp = f"{name}.{self._tag}-{next(self._seq)}.tmp"
        with self._chunk_dir(name, create=True) as directory:
            try:
                size = self._write_tmp(directory, tmp, key, region, slot, direct)
                rename_into_place(directory, tmp, name)
            except BaseException:
                with suppress(OSError):
                    os.unlink(tmp, dir_fd=directory)
                raise
            if self._fsync:
                os.fsync(directory)
        return size

    def _direct_write(self, nbytes: int) -> bool:
        if not self.o_direct:
            return False
        return not (self.adaptive and self._policy.write_buffered(nbytes))

    def _write_tmp(
        self, directory: int, tmp: str, key: ChunkKey, region: HostRegion, slot: int, direct: bool
    ) -> int:
        payload = region.view(slot)
        flags = self._write_flags | os.O_CLOEXEC | (O_DIRECT if direct else 0)
        fd = os.open(tmp, flags, 0o644, dir_fd=directory)
        try:
            if direct:
                scratch = self._scratch()
                digest = payload_checksum(payload)
                scratch[:] = encode_header(self._digest, key, payload, digest)
                aligned = region.aligned_view(slot)
                pwrite_all(fd, [scratch, aligned])
                if len(aligned) != len(payload):
                    os.ftruncate(fd, HEADER_BYTES + len(payload))  # drop the slot's padding
            else:
                header = encode_header(self._digest, key, payload, payload_checksum(payload))
                pwrite_all(fd, [header, payload])
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return HEADER_BYTES + len(payload)

    # -- reading ----------------------------------------------------------------------------
    def read(self, key: ChunkKey, region: HostRegion, slot: int) -> int:
        """Read chunk ``key`` straight into ``slot`` and verify it; returns the file size.

        Raises ``FileNotFoundError`` when there is no such chunk, ``NotRegularError`` when its
        path holds something else (left alone), ``OSError`` when it cannot be read, and
        ``IntegrityError`` when it fails verification; that file is deleted first (unless
        another writer replaced it meanwhile).
        """
        name = key.hex()
        fd = open_beneath(self._real, name, self._read_flags)
        if fd is None:  # no openat2, or a failure the walk names exactly
            with chunk_dir(self.namespace, name) as directory:
                fd, found = open_regular(directory, name, self._read_flags)
                return self._read_open(fd, found, key, region, slot)
        return self._read_open(fd, check_regular(fd, name), key, region, slot)

    def _read_open(
        self, fd: int, found: os.stat_result, key: ChunkKey, region: HostRegion, slot: int
    ) -> int:
        """Read and verify the open chunk file ``fd`` (``found``: its fstat), then close it."""
        try:
            header, payload = self._scratch(), region.view(slot)
            got, digest = self._read_bytes(fd, header, region, slot, found.st_size)
            try:
                self._verify(key, header, payload, got, found.st_size, digest)
            except IntegrityError:
                name = key.hex()
                with suppress(OSError), chunk_dir(self.namespace, name) as directory:
                    unlink_if_same(directory, name, found)
                raise
        finally:
            os.close(fd)
        return found.st_size

    def _read_bytes(
        self, fd: int, header: memoryview, region: HostRegion, slot: int, size: int
    ) -> tuple[int, bytes]:
        """Bytes read and payload checksum; "auto" tries the page cache, then O_DIRECT."""
        direct = self.o_direct
        if self.adaptive:
            direct = not CACHESTAT.is_cached(fd, size)
            if direct:
                fcntl.fcntl(fd, fcntl.F_SETFL, os.O_NONBLOCK | O_DIRECT)
        # O_DIRECT reads whole aligned pages: the slot's padding takes the rounding.
        target = region.aligned_view(slot) if direct else region.view(slot)
        return read_chunk(fd, header, target, size)

    def _verify(
        self,
        key: ChunkKey,
        header: memoryview,
        payload: memoryview,
        got: int,
        size: int,
        digest: bytes,
    ) -> None:
        """Check what was read: ``got`` bytes of a ``size``-byte file (``digest``: of payload)."""
        if got < HEADER_BYTES:
            raise IntegrityError(f"file is {got} bytes, shorter than a header", "short")
        payload_got = min(got - HEADER_BYTES, len(payload))
        verify(header, payload[:payload_got], self._digest, key, digest)
        if size != HEADER_BYTES + len(payload) or payload_got != len(payload):
            raise IntegrityError(f"file is {size} bytes, not a chunk of {len(payload)}", "length")

    def size_of(self, key: ChunkKey) -> int | None:
        """Size of chunk ``key``'s file, ``None`` if there is none.

        Raises ``NotRegularError`` when its path holds something else, or another ``OSError``.
        """
        name = key.hex()
        try:
            fd = open_beneath(self._real, name, os.O_PATH)
            if fd is not None:
                result = check_regular(fd, name)
                os.close(fd)
                return result.st_size
            with chunk_dir(self.namespace, name) as directory:
                return regular_stat(directory, name).st_size
        except FileNotFoundError:
            return None

    def remove(self, key: ChunkKey) -> None:
        """Delete chunk ``key``'s entry (whatever it is, unless a directory); never via a link."""
        name = key.hex()
        with suppress(FileNotFoundError), chunk_dir(self.namespace, name) as directory:
            os.unlink(name, dir_fd=directory)

    @contextmanager
    def _chunk_dir(self, name: str, *, create: bool = False) -> Iterator[int]:
        """Chunk ``name``'s directory: one openat2 when it exists, else the walk of
        ``chunk_dir`` (which creates missing levels with ``create``)."""
        fd = open_level_beneath(self._real, name)
        if fd is None:
            with chunk_dir(self.namespace, name, create=create) as walked:
                yield walked
            return
        try:
            yield fd
        finally:
            os.close(fd)

    def _scratch(self) -> memoryview:
        """This thread's page-aligned header buffer (O_DIRECT needs aligned memory)."""
        buffer: memoryview | None = getattr(self._local, "header", None)
        if buffer is None:
            buffer = self._local.header = memoryview(mmap.mmap(-1, HEADER_BYTES))
        return buffer

    # -- start-up ---------------------------------------------------------------------------
    def scan(self, stop: threading.Event) -> ScanResult:
        """Every chunk file in the namespace; removes stale temporary files on the way.

        Follows no link. An entry that cannot be listed, stat'ed or removed, or is not what the
        layout expects there, is skipped and counted (``ScanResult.skipped``); the rest goes on.
        """
        result = ScanResult()
        for entries in _listings(self.namespace, result):
            if stop.is_set():
                break
            for entry in entries:
                self._scan_entry(entry, result)
        return result

    def _scan_entry(self, entry: os.DirEntry[str], result: ScanResult) -> None:
        try:
            if _KEY_NAME.fullmatch(entry.name):
                found = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(found.st_mode):
                    raise NotRegularError(entry.path)
                key = ChunkKey(bytes.fromhex(entry.name))
                result.chunks.append((found.st_mtime, key, found.st_size))
            elif entry.name.endswith(".tmp") and self._is_stale(entry):
                os.unlink(entry.path)
                result.stale_removed += 1
        except FileNotFoundError:
            pass  # removed meanwhile (evicted or renamed by another instance)
        except OSError as exc:
            result.skip(exc)

    def _is_stale(self, entry: os.DirEntry[str]) -> bool:
        match = _TMP_NAME.fullmatch(entry.name)
        if match is not None and match.group(3) == self._token:
            return False
        if time.time() - entry.stat(follow_symlinks=False).st_mtime > STALE_TMP_S:
            return True
        return match is not None and match.group(1) == HOST_TAG and not _pid_alive(int(match[2]))

    def _direct_io_works(self) -> bool:
        if not O_DIRECT:
            return False
        path = os.path.join(self.namespace, f".o_direct-probe.{self._tag}-0.tmp")
        block = self._scratch()
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | O_DIRECT, 0o644)
            try:
                return os.pwrite(fd, block, 0) == len(block) == os.preadv(fd, [block], 0)
            finally:
                os.close(fd)
        except OSError:
            return False
        finally:
            with suppress(OSError):
                os.unlink(path)


def _listings(namespace: str, result: ScanResult) -> Iterator[list[os.DirEntry[str]]]:
    """The entries of the namespace, then of each level-2 directory (real directories only)."""
    top = _entries(namespace, result)
    yield top
    for level1 in _level_dirs(top, result):
        for level2 in _level_dirs(_entries(level1, result), result):
            yield _entries(level2, result)


def _level_dirs(entries: list[os.DirEntry[str]], result: ScanResult) -> Iterator[str]:
    for entry in entries:
        if _LEVEL_NAME.fullmatch(entry.name) and _is_real_dir(entry, result):
            yield entry.path


def _is_real_dir(entry: os.DirEntry[str], result: ScanResult) -> bool:
    """Whether ``entry`` is a directory, not a link to one; anything else is counted."""
    try:
        if entry.is_dir(follow_symlinks=False):
            return True
        result.skip(NotRegularError(entry.path))
    except OSError as exc:
        result.skip(exc)
    return False


def _entries(directory: str, result: ScanResult) -> list[os.DirEntry[str]]:
    """The entries of ``directory``; none (counted) when it cannot be listed."""
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
