"""What the cache commands need of a layout: the ``Store`` protocol that ``fs_store`` and
``s3_store`` answer, and ``ChunkRead``, one chunk read back for ``verify``.

A namespace is one cache identity's chunks (``Namespace``: its ``digest`` hex, what its
``identity.json`` says, and ``where`` for messages). Chunks are named by their key's hex.

Thread safety: as each implementation says; ``read`` and ``remove_*`` may be called from
several threads while one thread walks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from kvtier.cache.identity_doc import IdentityInfo
from kvtier.cache.records import Problems, Usage
from kvtier.errors import KVTierError

#: The largest chunk ``verify`` reads by default (a 405B model's 2048 tokens take about 1 GiB).
MAX_CHUNK_BYTES = 2 << 30
#: One chunk as ``gc`` sees it: name (key hex), size in bytes, last use, parent key or ``None``.
Chunk = tuple[str, int, float, "bytes | None"]


class Namespace(Protocol):
    digest: str
    info: IdentityInfo


@dataclass
class ChunkRead:
    """A chunk read back: its header block and payload (views of the reader's buffers), the
    payload's xxh3-128 when it was hashed while reading (version-1 headers), and ``seen``:
    what ``remove_bad`` needs to delete exactly this copy."""

    header: memoryview
    payload: memoryview
    checksum: bytes | None
    seen: object


NS = TypeVar("NS", bound=Namespace)


class ChunkTooLarge(KVTierError):
    """A chunk (as its size or its header says) larger than a reader may hold."""


class Scratch:
    """A reader thread's reused buffer, replaced (never resized) when a larger one is needed,
    so views handed out earlier stay valid; never larger than ``limit`` bytes (a file or
    object anyone can write says how large it is). One per thread."""

    def __init__(self, limit: int = MAX_CHUNK_BYTES) -> None:
        self._buffer, self.limit = bytearray(), limit

    def view(self, nbytes: int) -> memoryview:
        """``nbytes`` of the buffer; ``ChunkTooLarge`` past ``limit`` (nothing allocated)."""
        if nbytes > self.limit:
            raise ChunkTooLarge(
                f"{nbytes} bytes, over the bound of {self.limit} (--max-chunk-bytes)"
            )
        if len(self._buffer) < nbytes:
            self._buffer = bytearray(nbytes)
        return memoryview(self._buffer)[:nbytes]


class Store(Protocol[NS]):
    """A cache directory or bucket prefix (``fs_store.FsStore``, ``s3_store.S3Store``)."""

    kind: str

    def close(self) -> None: ...

    def path(self, ns: NS, name: str = "") -> str:
        """Where chunk ``name`` (or the namespace) is, for messages."""
        ...

    def namespaces(self, problems: Problems) -> list[NS]: ...

    def usage(self, ns: NS, problems: Problems, *, links: bool) -> Usage: ...

    def chunks(self, ns: NS, problems: Problems) -> Iterator[Chunk]: ...

    def names(self, ns: NS, problems: Problems) -> Iterator[tuple[str, int]]:
        """Chunk names with their sizes (what ``verify`` reads)."""
        ...

    def read(self, ns: NS, name: str, size: int, scratch: Scratch) -> ChunkRead | None:
        """Chunk ``name`` (``size`` bytes as listed; 0: unknown) read into ``scratch``;
        ``None`` when it is gone. Raises ``OSError``/``KVTierError`` when it cannot be read."""
        ...

    def remove_bad(self, ns: NS, name: str, seen: object) -> bool: ...

    def remove_cold(self, ns: NS, name: str, mtime: float) -> bool: ...

    def temporaries(self, ns: NS) -> Iterator[tuple[str, int, float]]:
        """Temporary files of writes the last walk of ``ns`` met, still there: name, size,
        mtime (none on a bucket)."""
        ...

    def remove_temporary(self, ns: NS, name: str, mtime: float) -> bool:
        """Remove temporary ``name`` unless written since ``mtime``; whether it was removed."""
        ...
