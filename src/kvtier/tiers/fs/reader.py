"""ChunkReader: the fs tier's verified reads, chunk files into host slots.

A chunk file (``files``' layout: codec header block, then payload) is read straight into its
slot, then verified (``sealing``: header, length, checksum or tag) before the slot is handed
on; a file that fails is deleted, unless another writer replaced it meanwhile. A load job's
files are read in one call of the compiled path (``native.load_many``: the GIL released once
per job, so every I/O thread keeps a read in flight); one it hands back, and every platform
without it, takes the ``os``-module path (``_read_walk``), which names each failure. Where
``o_direct`` is adaptive (``page_cache``) each file is read from the page cache when it is all
there, else with O_DIRECT.

Thread safety: every method may be called from any thread; each thread has its own header
blocks (``scratch``).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable, Sequence
from contextlib import suppress

from kvtier.errors import IntegrityError
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.fs import native
from kvtier.tiers.fs.io import payload_checksum, pread_all
from kvtier.tiers.fs.namespace import Namespace
from kvtier.tiers.fs.page_cache import CACHESTAT
from kvtier.tiers.fs.paths import (
    check_regular,
    chunk_dir,
    level_path,
    open_beneath,
    open_regular,
    unlink_if_same,
)
from kvtier.tiers.fs.pin import NamespacePin
from kvtier.tiers.fs.scratch import ThreadScratch
from kvtier.tiers.shared.codec import HEADER_BYTES
from kvtier.tiers.shared.counters import Counters
from kvtier.tiers.shared.lineage import Link, read_link
from kvtier.tiers.shared.sealing import Sealer

O_DIRECT: int = getattr(os, "O_DIRECT", 0)

#: What ``read_many`` gives for one chunk: what ``read`` returns, or what it raises.
Read = tuple[int, Link | None] | Exception


class ChunkReader:
    """Verified reads of the chunk files in ``directory`` (a namespace of cache ``digest``),
    opened with ``sealer``. ``o_direct``: read with O_DIRECT (every file, or with
    ``adaptive`` each file not wholly in the page cache)."""

    def __init__(
        self,
        directory: Namespace,
        digest: bytes,
        sealer: Sealer,
        scratch: ThreadScratch,
        *,
        o_direct: bool,
        adaptive: bool,
    ) -> None:
        self._directory, self._digest, self._sealer = directory, digest, sealer
        self._scratch, self._o_direct, self._adaptive = scratch, o_direct, adaptive
        #: Chunk files read per path, ``page_cache`` or ``o_direct`` (each read, verified or
        #: not): what "auto" chose, visible in the tier's stats as ``read_path.<path>``.
        self._read_paths = Counters()
        self._read_flags = os.O_RDONLY | (O_DIRECT if o_direct and not adaptive else 0)

    def read_path_counts(self) -> dict[str, int]:
        """``read_path.page_cache`` and ``read_path.o_direct``: chunk files read each way."""
        counts = self._read_paths.snapshot()
        return {f"read_path.{path}": counts.get(path, 0) for path in ("page_cache", "o_direct")}

    def read(self, key: ChunkKey, region: HostRegion, slot: int) -> tuple[int, Link | None]:
        """Read chunk ``key`` straight into ``slot`` and verify it; returns the file size and
        the link the file carries (``lineage``; ``None`` when it has none).

        Raises ``FileNotFoundError`` when there is no such chunk, ``NotRegularError`` when its
        path holds something else (left alone), ``OSError`` when it cannot be read, and
        ``IntegrityError`` when it fails verification; that file is deleted first (unless
        another writer replaced it meanwhile).
        """
        name = key.hex()
        header, payload, pin = self._scratch.header(), region.view(slot), self._pin()
        args = (header, payload, region.aligned_view(slot), self._read_flags)
        fold = not self._sealer.keyed
        loaded = native.load(pin, _chunk_path(name), *args, self._adaptive, O_DIRECT, fold)
        loaded = loaded or self._read_walk(pin, name, *args)
        return self._checked(key, pin, header, payload, loaded)

    def read_many(
        self, keys: Sequence[ChunkKey], region: HostRegion, slots: Sequence[int]
    ) -> list[Read]:
        """``read`` of each chunk into its slot, in one call of the compiled path for them all
        where it is built (``native.load_many``). One result per chunk, in order: what ``read``
        returns, or the exception it raises (an ``Exception``, not raised here)."""
        pin, batch = self._directory.pin, None
        if pin is not None and len(keys) > 1:
            headers = self._scratch.headers(len(keys))
            plains = [region.view(slot) for slot in slots]
            aligned = [region.aligned_view(slot) for slot in slots]
            paths = [_chunk_path(key.hex()) for key in keys]
            args = (self._read_flags, self._adaptive, O_DIRECT, not self._sealer.keyed)
            batch = native.load_many(pin, paths, headers, plains, aligned, *args)
        if pin is None or batch is None:
            return [_attempt(self.read, k, region, s) for k, s in zip(keys, slots, strict=True)]
        blocks = [headers[i * HEADER_BYTES : (i + 1) * HEADER_BYTES] for i in range(len(keys))]
        return [
            _attempt(self._landed, key, region, slot, pin, block, loaded)
            for key, slot, block, loaded in zip(keys, slots, blocks, batch, strict=True)
        ]

    def _landed(
        self,
        key: ChunkKey,
        region: HostRegion,
        slot: int,
        pin: NamespacePin,
        header: memoryview,
        loaded: native.Loaded | int | None,
    ) -> tuple[int, Link | None]:
        """``read``'s result for what ``native.load_many`` did with chunk ``key``: checked when
        read; anything else but absence is read again by ``read``, which names it."""
        if isinstance(loaded, tuple):
            return self._checked(key, pin, header, region.view(slot), loaded)
        if loaded == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, "no such chunk file", key.hex())
        return self.read(key, region, slot)

    def _checked(
        self,
        key: ChunkKey,
        pin: NamespacePin,
        header: memoryview,
        payload: memoryview,
        loaded: native.Loaded,
    ) -> tuple[int, Link | None]:
        """Verify what a load read (``_verify``); a file that fails is deleted (unless another
        writer replaced it meanwhile) and ``IntegrityError`` raised."""
        size, got, device, inode, direct, digest = loaded
        self._read_paths.add("o_direct" if direct else "page_cache")
        if digest is None and not self._sealer.keyed:
            digest = payload_checksum(payload[: max(0, got - HEADER_BYTES)])
        try:
            self._verify(key, header, payload, got, size, digest)
        except IntegrityError:
            name = key.hex()
            with suppress(OSError), chunk_dir(pin.fd, name) as directory:
                unlink_if_same(directory, name, (device, inode))
            raise
        return size, read_link(header)

    def _read_walk(
        self,
        pin: NamespacePin,
        name: str,
        header: memoryview,
        plain: memoryview,
        aligned: memoryview,
        flags: int,
    ) -> native.Loaded:
        """``native.load`` through the ``os`` module; raises what ``read`` documents."""
        pin.check()
        fd = open_beneath(pin.fd, name, flags)
        if fd is None:  # no openat2, or a failure the walk names exactly
            with chunk_dir(pin.fd, name) as directory:
                fd, found = open_regular(directory, name, flags)
        else:
            found = check_regular(fd, name)
        try:
            direct = self._o_direct
            if self._adaptive:
                direct = not CACHESTAT.is_cached(fd, found.st_size)
                if direct:
                    fcntl.fcntl(fd, fcntl.F_SETFL, os.O_NONBLOCK | O_DIRECT)
            # O_DIRECT reads whole aligned pages: the slot's padding takes the rounding.
            got = pread_all(fd, [header, aligned if direct else plain], 0, found.st_size)
        finally:
            os.close(fd)
        return found.st_size, got, found.st_dev, found.st_ino, direct, None

    def _verify(
        self,
        key: ChunkKey,
        header: memoryview,
        payload: memoryview,
        got: int,
        size: int,
        digest: bytes | None,
    ) -> None:
        """Check what was read: ``got`` bytes of a ``size``-byte file (``digest``: of payload,
        unless sealed with a key); an encrypted payload is decrypted in place."""
        if got < HEADER_BYTES:
            raise IntegrityError(f"file is {got} bytes, shorter than a header", "short")
        payload_got = min(got - HEADER_BYTES, len(payload))
        self._sealer.open(header, payload[:payload_got], self._digest, key, digest)
        if size != HEADER_BYTES + len(payload) or payload_got != len(payload):
            raise IntegrityError(f"file is {size} bytes, not a chunk of {len(payload)}", "length")

    def _pin(self) -> NamespacePin:
        """The pinned namespace; ``FileNotFoundError`` while there is none (not made yet)."""
        pin = self._directory.pin
        if pin is None:
            raise FileNotFoundError(errno.ENOENT, "no namespace directory", self._directory.path)
        return pin


def _chunk_path(name: str) -> str:
    """Chunk file ``name``'s path below the namespace."""
    return f"{level_path(name)}/{name}"


def _attempt(read: Callable[..., tuple[int, Link | None]], *args: object) -> Read:
    """``read(*args)``, or the exception it raised."""
    try:
        return read(*args)
    except Exception as exc:  # handed to the caller, which names each kind
        return exc
