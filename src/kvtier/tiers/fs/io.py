"""The bytes of one chunk file through an open file descriptor: header block, then payload.

This is the ``os``-module path, taken where the compiled one (``native``) is not built or hands
a file back. A chunk moves in one ``preadv`` / ``pwritev`` of [header block, payload] (straight
from or into the host slot), and its payload is hashed in one call; both release the GIL for
their whole duration. Hashing piece by piece from Python was measured slower (the GIL round
trips of many small calls cost more than the second pass); the compiled path does it inside
one call instead. Short transfers (a signal, a file-size limit) are resumed until done, or
until end of file on reads.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

from kvtier.tiers.shared.codec import checksum as payload_checksum

__all__ = ["payload_checksum", "pread_all", "pwrite_all"]


def pwrite_all(fd: int, buffers: Sequence[bytes | memoryview], offset: int = 0) -> None:
    """Write every byte of ``buffers`` at ``offset``; raises ``OSError`` (ENOSPC, EFBIG...)."""
    total = sum(len(b) for b in buffers)
    done = os.pwritev(fd, buffers, offset)
    while done < total:
        wrote = os.pwritev(fd, _skip(buffers, done), offset + done)
        if wrote == 0:  # no progress: fail rather than spin
            raise OSError(errno.EIO, "a write made no progress")
        done += wrote


def pread_all(fd: int, buffers: Sequence[memoryview], offset: int, limit: int) -> int:
    """Fill ``buffers`` from ``offset`` with up to ``limit`` bytes (less at EOF); bytes read."""
    want = min(limit, sum(len(b) for b in buffers))
    done = os.preadv(fd, buffers, offset)
    while 0 < done < want:
        got = os.preadv(fd, _skip(buffers, done), offset + done)
        if got == 0:
            break
        done += got
    return done


def _skip(buffers: Sequence[bytes | memoryview], nbytes: int) -> list[memoryview]:
    """The buffers without their first ``nbytes`` bytes (for resuming a short transfer)."""
    rest = []
    for buffer in buffers:
        view = memoryview(buffer)
        rest.append(view[min(nbytes, len(view)) :])
        nbytes = max(0, nbytes - len(view))
    return [view for view in rest if len(view)]
