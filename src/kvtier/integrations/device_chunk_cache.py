"""DeviceChunkCache: the accelerator's own prefix cache of an engine built on transformers.

kvtier's tiers sit below it: a chunk it evicts may still be in host memory or a tier. Used by
``TieredModel`` and the bench's engine harness.

Thread safety: none; it belongs to the engine's thread.
"""

from __future__ import annotations

import numbers
from collections import OrderedDict
from collections.abc import Sequence

import torch

from kvtier.errors import InvalidArgumentError, shown
from kvtier.keys import ChunkKey


class DeviceChunkCache:
    """The engine's accelerator-side prefix cache: chunk key -> canonical chunk tensor, LRU.

    ``capacity`` counts chunks; ``None`` never evicts, ``0`` keeps nothing
    (``InvalidArgumentError`` for anything but ``None`` or an integer >= 0).
    """

    def __init__(self, capacity: int | None) -> None:
        self.capacity = _checked_capacity(capacity)
        self._chunks: OrderedDict[ChunkKey, torch.Tensor] = OrderedDict()
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._chunks)

    def match(self, keys: Sequence[ChunkKey]) -> int:
        """How many leading ``keys`` are cached."""
        count = 0
        while count < len(keys) and keys[count] in self._chunks:
            count += 1
        return count

    def match_window(self, keys: Sequence[ChunkKey], window: int) -> int:
        """The longest prefix of ``keys`` whose last ``window`` chunks are all cached."""
        end = len(keys)
        while end > 0:
            missing = [i for i in range(max(0, end - window), end) if keys[i] not in self._chunks]
            if not missing:
                return end
            end = missing[-1]
        return 0

    def get(self, keys: Sequence[ChunkKey]) -> list[torch.Tensor]:
        """The chunks of ``keys`` (all cached), marked most recently used."""
        self.touch(keys)
        return [self._chunks[key] for key in keys]

    def touch(self, keys: Sequence[ChunkKey]) -> None:
        """Mark the cached ``keys`` used, the first most recently: a prefix outlives its tail."""
        for key in reversed(keys):
            if key in self._chunks:
                self._chunks.move_to_end(key)

    def put(self, keys: Sequence[ChunkKey], chunks: Sequence[torch.Tensor]) -> None:
        """Cache ``chunks`` under ``keys``, evicting the least recently used beyond capacity."""
        if self.capacity == 0:
            return
        for key, chunk in zip(reversed(keys), reversed(chunks), strict=True):
            self._chunks[key] = chunk
            self._chunks.move_to_end(key)
        while self.capacity is not None and len(self._chunks) > self.capacity:
            self._chunks.popitem(last=False)
            self.num_evicted += 1


def _checked_capacity(capacity: object) -> int | None:
    """``capacity`` as ``None`` or an int >= 0 (never a bool, a float or NaN)."""
    if capacity is None:
        return None
    if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral) or capacity < 0:
        raise InvalidArgumentError(
            f"capacity: expected None or an integer >= 0, got {shown(capacity)}"
        )
    return int(capacity)
