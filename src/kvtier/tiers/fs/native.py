"""The compiled path of the filesystem tier: one chunk file per call, the GIL released once.

``_fastio`` (``_fastio.c``, built at install on Linux) opens, writes or reads, renames and
closes a chunk file in one call. Through the ``os`` module the same work is five to seven
calls, each a release and retake of the GIL; with 16 I/O threads every retake is a futex
handoff, and for small chunks those handoffs cost more CPU than the I/O (issue 17: at 256 KiB,
stores made ~90 futex calls per chunk). It follows the same rules as ``paths``: no link is
followed (``openat2`` with ``RESOLVE_NO_SYMLINKS``), no ``open`` blocks, nothing but a regular
file is read. Both work below the namespace's pinned descriptor (``pin``) and first check that
its path still names it; a swapped namespace fails the call (ESTALE), and the ``os``-module
path then names it (``NamespaceSwappedError``). A load can also hash the payload (``fold``),
and a store fill in the header's checksums (``fold_at``), inside the same call: half the CPU
of hashing in a second call at 8 MiB (one GIL handoff fewer per chunk). Comparing the checksum
with the header's stays in Python.

Both functions answer ``None``/``False`` when the compiled path cannot do the job: the module
is not built (``AVAILABLE`` is false), the kernel has no ``openat2``, or the call failed for
any reason but absence. The caller then takes the ``os``-module path, which names the failure
exactly (``NotRegularError``, an errno) and counts it; failures are rare, so doing the work
twice then costs nothing that matters.

``scan_chunks`` lists one level directory of the layout with every chunk file's ``lstat``
(and, when asked, its link: ``kvtier.tiers.shared.lineage``) in one call, for ``kvtier cache``
over millions of files.

Thread safety: plain functions; any thread.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from kvtier.config.file_modes import DEFAULT_DIR_MODE, DEFAULT_FILE_MODE
from kvtier.tiers.fs.paths import OPENAT2
from kvtier.tiers.fs.pin import NamespacePin
from kvtier.tiers.shared.lineage import LINK_BYTES, LINK_OFFSET

_fastio: ModuleType | None
try:
    from kvtier.tiers.fs import _fastio
except ImportError:  # not built: no compiler at install, or not Linux
    _fastio = None

#: The calling convention native.py speaks; a module built from another ``_fastio.c`` (a
#: stale build in a working tree) is not used.
ABI = 6
if _fastio is not None and getattr(_fastio, "ABI", 1) != ABI:
    _fastio = None

#: Whether the compiled module is installed (the fs tier reports it in ``stats()``).
AVAILABLE = _fastio is not None

#: (file size, bytes read, st_dev, st_ino, whether it was read with O_DIRECT, the payload's
#: checksum when the load folded it: ``codec.checksum`` of ``plain[: bytes read - header]``)
Loaded = tuple[int, int, int, int, bool, bytes | None]


def usable() -> bool:
    """Whether the compiled path is installed and the kernel has ``openat2``."""
    return _fastio is not None and OPENAT2.available


def store(
    pin: NamespacePin,
    name: str,
    tmp: str,
    buffers: tuple[memoryview | bytes, memoryview],
    truncate_to: int,
    flags: int,
    fsync: bool,
    modes: tuple[int, int] = (DEFAULT_DIR_MODE, DEFAULT_FILE_MODE),
    fold_at: int = 0,
) -> bool:
    """Write chunk file ``name`` below the pinned namespace ``pin``, in its level directories
    (``name[:2]/name[2:4]``, made where missing with ``modes[0]``): ``buffers`` go to ``tmp``
    (open ``flags`` added; created with ``modes[1]``), which is then renamed to ``name``. The
    umask may narrow both modes.

    ``truncate_to`` >= 0 sets the final size (an O_DIRECT write of a padded slot). With
    ``fsync`` the file and the directory are synced. ``tmp`` is gone afterwards whatever
    happened. False when the compiled path did not store it (see the module docstring).

    ``fold_at`` > 0 (``codec.CHECKSUM_AT``): the payload's checksum, then the header's own, are
    filled into the header block (a writable buffer, left holding the header as written)
    before it is written.
    """
    if _fastio is None or not OPENAT2.available:
        return False
    levels = (name[:2].encode(), name[2:4].encode())
    try:
        _fastio.store(
            pin.native,
            *levels,
            tmp.encode(),
            name.encode(),
            *buffers,
            truncate_to,
            flags,
            fsync,
            *modes,
            fold_at,
        )
    except OSError:
        return False
    return True


def load(
    pin: NamespacePin,
    path: str,
    header: memoryview,
    plain: memoryview,
    aligned: memoryview,
    flags: int,
    adaptive: bool,
    o_direct: int,
    fold: bool,
) -> Loaded | None:
    """Read the chunk file at ``path`` below the pinned namespace ``pin`` (open ``flags``):
    header block, then payload, with ``fold`` hashing the payload read.

    The payload lands in ``plain``, or in ``aligned`` (the slot with its padding) when the read
    is O_DIRECT: because ``flags`` has ``o_direct``, or with ``adaptive`` because the file is
    not wholly in the page cache (``cachestat``). Raises ``FileNotFoundError`` when there is no
    such file; ``None`` when the compiled path did not read it (see the module docstring).
    """
    if _fastio is None or not OPENAT2.available:
        return None
    try:
        loaded: Loaded | None = _fastio.load(
            pin.native,
            path.encode(),
            header,
            plain,
            aligned,
            flags,
            adaptive,
            o_direct,
            fold,
        )
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, "no such chunk file", path) from None
        return None
    return loaded


def load_many(
    pin: NamespacePin,
    paths: Sequence[str],
    headers: memoryview,
    plains: Sequence[memoryview],
    aligned: Sequence[memoryview],
    flags: int,
    adaptive: bool,
    o_direct: int,
    fold: bool,
) -> list[Loaded | int | None] | None:
    """``load`` of each path in turn, in one call: the GIL released once and the pin checked
    once for them all. ``headers`` holds one header block per path, in order.

    One result per path: ``Loaded``; ``None`` for an entry that is not a regular file
    (nothing read); or the errno of a load that failed (``ENOENT``: no such chunk file).
    ``None`` instead of the list when the compiled path did not read them (not built, no
    ``openat2``, or the namespace was swapped: ``load`` of each then names it).
    """
    if _fastio is None or not OPENAT2.available:
        return None
    encoded = tuple(path.encode() for path in paths)
    try:
        loaded: list[Loaded | int | None] = _fastio.load_many(
            pin.native,
            encoded,
            headers,
            tuple(plains),
            tuple(aligned),
            flags,
            adaptive,
            o_direct,
            fold,
        )
    except OSError:
        return None
    return loaded


#: One chunk file as ``scan_chunks`` lists it (``_fastio.c``'s ``struct chunk_rec``).
CHUNK_RECORD = np.dtype(
    [
        ("key", "V32"),
        ("size", "<i8"),
        ("disk", "<i8"),
        ("mtime", "<f8"),
        ("link_err", "<i4"),
        ("level", "<i4"),
        ("link", f"V{LINK_BYTES}"),
        ("tail", "V8"),
    ]
)


@dataclass(frozen=True)
class ChunkListing:
    """A level directory's chunk files (``CHUNK_RECORD`` each; ``link`` is the raw bytes for
    ``lineage.read_link``, zeros with ``link_err`` set where it could not be read) and its
    other entries as (name, ``d_type``)."""

    chunks: np.ndarray
    others: list[tuple[str, int]]


def scan_chunks(dir_fd: int, links: bool, depth: int = 0) -> ChunkListing | None:
    """Every entry of the directory open as ``dir_fd``: regular files with 64-hex names as
    records (``lstat`` and, with ``links``, each file's link), anything else by name. With
    ``depth`` 1 the two-hex-digit directories in it are listed the same way (each record's
    ``level`` is its directory's value, other names are ``cd/name``); one that cannot be
    opened or listed without following a link is among the other names. Follows no link,
    opens nothing that blocks. ``None`` when the compiled path is not built; ``OSError``
    when ``dir_fd`` cannot be listed."""
    if _fastio is None:
        return None
    records, others = _fastio.scan_chunks(dir_fd, links, LINK_OFFSET, depth)
    names = [(os.fsdecode(entry[1:]), entry[0]) for entry in others.split(b"\0") if entry]
    return ChunkListing(np.frombuffer(records, dtype=CHUNK_RECORD), names)
