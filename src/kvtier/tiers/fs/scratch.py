"""Per-thread page-aligned buffers for the fs tier's I/O threads.

O_DIRECT transfers need page-aligned memory: a header block to read into or write from, and,
for an encrypting sealer, a body to hold a chunk's ciphertext. Each I/O thread keeps its own,
made on first use, so no buffer is ever shared between two transfers in flight.

Thread safety: any thread; each sees only its own buffers.
"""

from __future__ import annotations

import mmap
import threading

from kvtier.tiers.shared.codec import HEADER_BYTES


class ThreadScratch:
    """This thread's buffers (``threading.local``)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def header(self) -> memoryview:
        """A page-aligned block of ``HEADER_BYTES``."""
        buffer: memoryview | None = getattr(self._local, "header", None)
        if buffer is None:
            buffer = self._local.header = memoryview(mmap.mmap(-1, HEADER_BYTES))
        return buffer

    def headers(self, count: int) -> memoryview:
        """``count`` page-aligned blocks of ``HEADER_BYTES``, back to back (kept, and made again
        when more are asked for); not the block ``header`` gives."""
        buffer: memoryview | None = getattr(self._local, "headers", None)
        if buffer is None or len(buffer) < count * HEADER_BYTES:
            buffer = self._local.headers = memoryview(mmap.mmap(-1, count * HEADER_BYTES))
        return buffer[: count * HEADER_BYTES]

    def body(self, nbytes: int) -> memoryview:
        """A page-aligned buffer of ``nbytes`` (made again when the size changes)."""
        buffer: memoryview | None = getattr(self._local, "body", None)
        if buffer is None or len(buffer) != nbytes:
            buffer = self._local.body = memoryview(mmap.mmap(-1, nbytes))
        return buffer
