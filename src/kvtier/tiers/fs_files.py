"""ChunkFiles: the on-disk layout of the filesystem tier, atomic writes and verified reads.

Layout under ``root_dir``::

    <identity digest hex>/            one namespace per cache identity
        identity.json                 what the digest stands for (human-readable)
        ab/cd/abcd…(64 hex)           one chunk: codec header block (4096 B) + payload
        ab/cd/abcd….<tag>-<n>.tmp     a write in progress; <tag> = host-pid-instance

A chunk is written to a temporary file in its final directory and renamed into place, so a
crash leaves either a complete chunk or none under the final name. Temporary files whose writer
is gone (same host, dead pid; or older than ``STALE_TMP_S``) are removed by ``scan``.

Thread safety: every method may be called from any thread; per-thread scratch buffers live in
a ``threading.local``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import mmap
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field

from kvtier.errors import IntegrityError, TierError
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.codec import FORMAT_VERSION, HEADER_BYTES, encode_header, verify
from kvtier.tiers.fs_io import (
    payload_checksum,
    pwrite_all,
    read_chunk,
)

#: A temporary file older than this is stale whoever wrote it (a write takes far less).
STALE_TMP_S = 600.0
O_DIRECT: int = getattr(os, "O_DIRECT", 0)
_KEY_NAME = re.compile(r"[0-9a-f]{64}")
_LEVEL_NAME = re.compile(r"[0-9a-f]{2}")
_TMP_NAME = re.compile(r".*\.([0-9a-f]+)-(\d+)-([0-9a-f]+)-\d+\.tmp")
#: Names this host in temporary files (a dead writer on this host is recognised by its pid).
HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


@dataclass
class ScanResult:
    """Chunk files found by ``scan`` as (mtime, key, size), and stale temporaries removed."""

    chunks: list[tuple[float, ChunkKey, int]] = field(default_factory=list)
    stale_removed: int = 0


class ChunkFiles:
    """The chunk files of one cache identity under ``root_dir``.

    Creating it creates the namespace and checks that it is writable (``TierError`` otherwise);
    ``o_direct`` is ``"on"`` (``TierError`` if the filesystem refuses it), ``"off"``, or
    ``"auto"`` (used when a probe write and read succeed).
    """

    def __init__(
        self, root_dir: str, identity: CacheIdentity, *, o_direct: str = "auto", fsync: bool = False
    ) -> None:
        self.namespace = os.path.join(os.path.abspath(root_dir), identity.hexdigest)
        self._digest = identity.digest
        self._fsync = fsync
        self._token = secrets.token_hex(4)
        self._tag = f"{HOST_TAG}-{os.getpid()}-{self._token}"
        self._seq = itertools.count()
        self._local = threading.local()
        _create_namespace(root_dir, self.namespace, identity, self._tag)
        self.o_direct = o_direct != "off" and self._direct_io_works()
        if o_direct == "on" and not self.o_direct:
            raise TierError(f"fs tier: o_direct is 'on' but {root_dir} does not allow O_DIRECT")
        direct = O_DIRECT if self.o_direct else 0
        self._read_flags = os.O_RDONLY | os.O_CLOEXEC | direct
        self._write_flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | direct

    def path(self, key: bytes) -> str:
        name = key.hex()
        return os.path.join(self.namespace, name[:2], name[2:4], name)

    # -- writing ----------------------------------------------------------------------------
    def write(self, key: ChunkKey, region: HostRegion, slot: int) -> int:
        """Store ``slot`` as chunk ``key``, atomically; returns the file size. Raises OSError."""
        final = self.path(key)
        tmp = f"{final}.{self._tag}-{next(self._seq)}.tmp"
        try:
            size = self._write_tmp(tmp, key, region, slot)
            os.rename(tmp, final)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp)
            raise
        if self._fsync:
            _fsync_dir(os.path.dirname(final))
        return size

    def _write_tmp(self, tmp: str, key: ChunkKey, region: HostRegion, slot: int) -> int:
        fd = self._open_tmp(tmp)
        try:
            payload = region.view(slot)
            if self.o_direct:
                scratch = self._scratch()
                digest = payload_checksum(payload)
                scratch[:] = encode_header(self._digest, key, payload, digest)
                pwrite_all(fd, [scratch, region.aligned_view(slot)])
                os.ftruncate(fd, HEADER_BYTES + len(payload))  # drop the slot's padding
            else:
                header = encode_header(self._digest, key, payload, payload_checksum(payload))
                pwrite_all(fd, [header, payload])
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return HEADER_BYTES + len(payload)

    def _open_tmp(self, tmp: str) -> int:
        try:
            return os.open(tmp, self._write_flags, 0o644)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(tmp), exist_ok=True)
            return os.open(tmp, self._write_flags, 0o644)

    # -- reading ----------------------------------------------------------------------------
    def read(self, key: ChunkKey, region: HostRegion, slot: int) -> int:
        """Read chunk ``key`` straight into ``slot`` and verify it; returns the file size.

        Raises ``FileNotFoundError`` when there is no such chunk, ``OSError`` when it cannot be
        read, and ``IntegrityError`` when it fails verification; that file is deleted first
        (unless another writer replaced it meanwhile).
        """
        path = self.path(key)
        fd = os.open(path, self._read_flags)
        try:
            stat = os.fstat(fd)
            header, payload = self._scratch(), region.view(slot)
            # O_DIRECT reads whole aligned pages: the slot's padding takes the rounding.
            target = region.aligned_view(slot) if self.o_direct else payload
            got, digest = read_chunk(fd, header, target, stat.st_size)
            try:
                self._verify(key, header, payload, got, stat.st_size, digest)
            except IntegrityError:
                _unlink_if_same(path, stat)
                raise
        finally:
            os.close(fd)
        return stat.st_size

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
        """Size of chunk ``key``'s file, ``None`` if there is none. Raises other ``OSError``s."""
        try:
            return os.stat(self.path(key)).st_size
        except FileNotFoundError:
            return None

    def remove(self, key: ChunkKey) -> None:
        with suppress(FileNotFoundError):
            os.unlink(self.path(key))

    def _scratch(self) -> memoryview:
        """This thread's page-aligned header buffer (O_DIRECT needs aligned memory)."""
        buffer: memoryview | None = getattr(self._local, "header", None)
        if buffer is None:
            buffer = self._local.header = memoryview(mmap.mmap(-1, HEADER_BYTES))
        return buffer

    # -- start-up ---------------------------------------------------------------------------
    def scan(self, stop: threading.Event) -> ScanResult:
        """Every chunk file in the namespace; removes stale temporary files on the way."""
        result = ScanResult()
        for directory in self._directories():
            if stop.is_set():
                break
            for entry in _entries(directory):
                with suppress(FileNotFoundError):
                    self._scan_entry(entry, result)
        return result

    def _scan_entry(self, entry: os.DirEntry[str], result: ScanResult) -> None:
        if _KEY_NAME.fullmatch(entry.name):
            stat = entry.stat()
            key = ChunkKey(bytes.fromhex(entry.name))
            result.chunks.append((stat.st_mtime, key, stat.st_size))
        elif entry.name.endswith(".tmp") and self._is_stale(entry):
            os.unlink(entry.path)
            result.stale_removed += 1

    def _directories(self) -> Iterator[str]:
        yield self.namespace
        for level1 in _entries(self.namespace):
            if _LEVEL_NAME.fullmatch(level1.name) and level1.is_dir():
                for level2 in _entries(level1.path):
                    if _LEVEL_NAME.fullmatch(level2.name) and level2.is_dir():
                        yield level2.path

    def _is_stale(self, entry: os.DirEntry[str]) -> bool:
        match = _TMP_NAME.fullmatch(entry.name)
        if match is not None and match.group(3) == self._token:
            return False
        if time.time() - entry.stat().st_mtime > STALE_TMP_S:
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


def _create_namespace(root_dir: str, namespace: str, identity: CacheIdentity, tag: str) -> None:
    """Create the namespace with its identity.json; ``TierError`` if it cannot be written."""
    description = {
        "format": "kvtier-fs",
        "format_version": FORMAT_VERSION,
        "digest": identity.hexdigest,
        "identity": identity.describe(),
    }
    target = os.path.join(namespace, "identity.json")
    tmp = f"{target}.{tag}-0.tmp"
    try:
        os.makedirs(namespace, exist_ok=True)
        with open(tmp, "w") as file:
            json.dump(description, file, indent=2, sort_keys=True)
        os.rename(tmp, target)
    except OSError as exc:
        with suppress(OSError):
            os.unlink(tmp)
        raise TierError(
            f"fs tier: cannot write under root_dir {root_dir!r}: {exc.strerror or exc}"
        ) from exc


def _entries(directory: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _unlink_if_same(path: str, stat: os.stat_result) -> None:
    with suppress(OSError):
        now = os.stat(path)
        if (now.st_dev, now.st_ino) == (stat.st_dev, stat.st_ino):
            os.unlink(path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SpaceGuard:
    """Refuses writes that would leave less than ``min_free_bytes`` free on the filesystem.

    ``statvfs`` is asked at most every ``interval_s`` seconds; bytes written in between are
    subtracted from its last answer. Thread safety: every method takes ``_lock``.
    """

    def __init__(self, path: str, min_free_bytes: int, interval_s: float = 0.25) -> None:
        self._path = path
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
                stat = os.statvfs(self._path)
                self._free = stat.f_bavail * stat.f_frsize
                self._next_check = now + self._interval_s
            return self._free - nbytes >= self._min_free

    def wrote(self, nbytes: int) -> None:
        with self._lock:
            self._free -= nbytes
