"""LinkBook: the predecessor of each chunk the engine stored, until its write-through starts.

``prepare_store`` knows which chunk comes before each key (the keys are consecutive chunks of
one prefix); the tiers learn it from the store job (``TransferJob.links``), write it with the
chunk and evict by it (``tiers.shared.chunk_index``). The book is bounded: a key whose entry
was forgotten is stored without a link, which a tier takes for the head of a chain.

Thread safety: none; it belongs to the manager's thread.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvtier.keys import ChunkKey
from kvtier.tiers.shared.lineage import Link, chain_links


class LinkBook:
    """Key → ``Link`` of the last ``capacity`` keys recorded (oldest forgotten first)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = max(1, capacity)
        self._links: OrderedDict[ChunkKey, Link] = OrderedDict()

    def record(self, keys: Sequence[ChunkKey], first_chunk: int, parent: bytes | None) -> None:
        """``keys`` are consecutive chunks of one prefix, ``keys[0]`` its chunk ``first_chunk``
        and preceded by ``parent`` (``None``: first of its chain, or not known)."""
        for key, link in zip(keys, chain_links(keys, first_chunk, parent), strict=True):
            self._links[key] = link
            self._links.move_to_end(key)
        while len(self._links) > self._capacity:
            self._links.popitem(last=False)

    def links_of(self, keys: Sequence[ChunkKey]) -> tuple[Link, ...]:
        """One link per key (``Link()`` where none is known); empty when none is known."""
        links = tuple(self._links.get(key, _UNKNOWN) for key in keys)
        return links if any(link is not _UNKNOWN for link in links) else ()


_UNKNOWN = Link()
