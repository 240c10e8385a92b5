"""Rebuilding a bounded object tier's index from a listing of its own namespace, page by page.

At start a bounded tier lists ``<prefix>/<identity digest hex>/`` (``ObjectClient.list_pages``:
S3 pages of up to 1,000 names, handed out ``PAGE_SIZE`` at a time, each fetched when the one
before it is consumed). Of each page only the objects named as chunks are kept: a name of 64
lowercase hex digits right under the namespace. ``identity.json``, deeper names and anything
else are foreign: counted (``listing_ignored``), never indexed, so never deleted.

What is kept goes into ``ListedChunks``: 48 bytes an object (32-byte key, 8-byte size, 8-byte
time) in flat arrays, not the client's per-object dictionaries, so a listing of N chunks holds
about 48 N bytes plus one page. When the listing ends, the chunks are sorted by last modified
and merged into the index newest first, ``MERGE_BATCH`` at a time (``ObjectBound.merge_listed``):
each batch goes below every key known before it, so the whole is in age order without ever
building one list of it, and what exceeds ``max_bytes`` is evicted oldest first.

A listing that fails part way (``TierError``) resumes after the last name it saw
(``NamespaceListing.after``). Thread safety: one listing belongs to the thread that runs it.
"""

from __future__ import annotations

import re
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np

from kvtier.errors import TierError
from kvtier.keys import KEY_BYTES, ChunkKey
from kvtier.tiers.s3.bound import ListedChunk, ObjectBound
from kvtier.tiers.s3.client import Listed, ObjectClient

#: Objects per page handed out by the client (S3 itself answers up to 1,000 a request).
PAGE_SIZE = 1000
#: Chunks merged into the index at a time once the listing is sorted.
MERGE_BATCH = 4096

_CHUNK_NAME = re.compile(rf"[0-9a-f]{{{2 * KEY_BYTES}}}")


class ListedChunks:
    """Chunks found by a listing, in flat arrays (48 bytes each)."""

    def __init__(self) -> None:
        self._keys = bytearray()
        self._sizes = array("q")
        self._times = array("d")

    def __len__(self) -> int:
        return len(self._sizes)

    def add(self, key: bytes, size: int, when: float) -> None:
        self._keys += key
        self._sizes.append(size)
        self._times.append(when)

    def newest_first(self, batch: int) -> Iterator[list[ListedChunk]]:
        """The chunks, most recently modified first, in lists of at most ``batch``."""
        keys = np.frombuffer(bytes(self._keys), dtype=np.uint8).reshape(-1, KEY_BYTES)
        sizes, times = np.asarray(self._sizes), np.asarray(self._times)
        order = np.argsort(-times, kind="stable")
        for start in range(0, len(order), batch):
            chosen = order[start : start + batch]
            block = keys[chosen].tobytes()
            named = zip(sizes[chosen].tolist(), times[chosen].tolist(), strict=True)
            yield [
                (ChunkKey(block[j * KEY_BYTES : (j + 1) * KEY_BYTES]), size, when)
                for j, (size, when) in enumerate(named)
            ]


class NamespaceListing:
    """One listing of ``namespace`` (``<prefix>/<digest hex>``) into ``chunks``; resumable.

    A chunk name whose size is not ``object_bytes`` (when given) cannot be a chunk of this tier:
    it is counted (``listing_wrong_size``) and left out, never deleted, as foreign names are;
    its size, the store's word, must not make the bound evict the real ones. A name that does
    not sort after the one before it (a store that repeats its pages) fails the listing
    (``TierError``), so that a listing never holds a name twice.
    """

    def __init__(
        self, client: ObjectClient, namespace: str, object_bytes: int | None = None
    ) -> None:
        self._client, self._namespace = client, namespace
        self._object_bytes = object_bytes
        self._start = len(namespace) + 1
        self.chunks = ListedChunks()
        self.after: str | None = None  # the last name seen: a retry lists after it
        self.counts: Counter[str] = Counter()

    def run(self, stop: threading.Event, before_page: Callable[[], None] = lambda: None) -> bool:
        """List the rest of the namespace; ``False`` when ``stop`` was set first. Raises
        ``TierError`` when a page cannot be fetched (``run`` again resumes)."""
        before_page()
        for page in self._client.list_pages(self._namespace, self.after, PAGE_SIZE):
            self._take(page)
            if stop.is_set():
                return False
            before_page()
        return True

    def _take(self, page: list[Listed]) -> None:
        self.counts["listing_pages"] += 1
        for name, size, when in page:
            if self.after is not None and name <= self.after:
                raise TierError(f"the listing went back to {name!r} after {self.after!r}")
            self.after = name
            rest = name[self._start :]
            if not (name.startswith(f"{self._namespace}/") and _CHUNK_NAME.fullmatch(rest)):
                self.counts["listing_ignored"] += 1
            elif self._object_bytes is not None and size != self._object_bytes:
                self.counts["listing_wrong_size"] += 1
            else:
                self.chunks.add(bytes.fromhex(rest), size, when)
                self.counts["listing_chunks"] += 1

    def merge_into(self, bound: ObjectBound, stop: threading.Event, since: int) -> bool:
        """Merge what was listed into ``bound``'s index, newest first (see the module), but
        for keys dropped after its ``mark`` returned ``since``; ``False`` when ``stop`` was set
        first (the oldest are then left out)."""
        for batch in self.chunks.newest_first(MERGE_BATCH):
            if stop.is_set():
                return False
            bound.merge_listed(batch, since)
        self.chunks = ListedChunks()
        return True
