"""The bytes of one chunk file through an open file descriptor: header block, then payload.

Buffered transfers go in pieces of ``PIECE_BYTES``, each hashed right before it is written or
right after it is read, while it is still in CPU cache: hashing a whole multi-MiB slot apart
would stream it from DRAM a second time, which costs more than the checksum itself. Direct
(O_DIRECT) transfers bypass the CPU cache anyway, so they go in one aligned call. Short
transfers (a signal, a file-size limit) are resumed until done, or until end of file on reads.

Every function here is a sequence of plain ``os`` calls and streaming-hash updates, all of
which release the GIL (the codec's one-shot ``checksum`` holds it while hashing).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from kvtier.tiers.codec import HEADER_BYTES, checksum_stream

#: Piece size of buffered transfers: small enough to stay in a core's cache while it is hashed.
PIECE_BYTES = 256 << 10


def payload_checksum(payload: memoryview) -> bytes:
    """The codec ``checksum`` of ``payload``, computed with the GIL released."""
    hasher = checksum_stream()
    hasher.update(payload)
    digest: bytes = hasher.digest()
    return digest


def write_hashing(fd: int, payload: memoryview) -> bytes:
    """Write ``payload`` after the header block, piece by piece; returns its checksum."""
    hasher = checksum_stream()
    for start in range(0, len(payload), PIECE_BYTES):
        piece = payload[start : start + PIECE_BYTES]
        pwrite_all(fd, [piece], HEADER_BYTES + start)
        hasher.update(piece)  # after the copy: the piece is in cache now
    digest: bytes = hasher.digest()
    return digest


def read_hashing(fd: int, header: memoryview, payload: memoryview, size: int) -> tuple[int, bytes]:
    """Read the header block and up to ``len(payload)`` payload bytes of a ``size``-byte file.

    Returns the bytes read (header included) and the checksum of the payload bytes read.
    """
    hasher = checksum_stream()
    done = pread_all(fd, [header, payload[:PIECE_BYTES]], 0, size)
    hasher.update(payload[: max(0, done - HEADER_BYTES)])
    start = PIECE_BYTES
    while start < len(payload) and done == HEADER_BYTES + start:
        piece = payload[start : start + PIECE_BYTES]
        got = pread_all(fd, [piece], done, size - done)
        hasher.update(piece[:got])
        done += got
        start += PIECE_BYTES
    digest: bytes = hasher.digest()
    return done, digest


def pwrite_all(fd: int, buffers: Sequence[bytes | memoryview], offset: int = 0) -> None:
    """Write every byte of ``buffers`` at ``offset``; raises ``OSError`` (ENOSPC, EFBIG...)."""
    total = sum(len(b) for b in buffers)
    done = os.pwritev(fd, buffers, offset)
    while done < total:
        done += os.pwritev(fd, _skip(buffers, done), offset + done)


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
