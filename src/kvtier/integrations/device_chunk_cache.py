"""DeviceChunkCache: the accelerator's own prefix cache of an engine built on transformers.

kvtier's tiers sit below it: a chunk it evicts may still be in host memory or a tier. Used by
``TieredModel`` and the bench's engine harness.

Like a serving engine's KV pool, it keeps chunks in slots of tensors it allocated once: caching
a chunk copies it into a free slot, evicting one puts its slot back on the free list. Nothing is
freed while the cache lives, so an engine that evicts pays no allocator work for it (freeing
tensors per request made glibc hand heap back to the kernel and fault it in again).

Thread safety: none; it belongs to the engine's thread.
"""

from __future__ import annotations

import numbers
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import torch

from kvtier.errors import InvalidArgumentError, shown
from kvtier.keys import ChunkKey

_FIRST_SLOTS = 16  # the first pool tensor's slots; each later one doubles the pool


class DeviceChunkCache:
    """The engine's accelerator-side prefix cache: chunk key -> canonical chunk tensor, LRU.

    ``capacity`` counts chunks; ``None`` never evicts, ``0`` keeps nothing
    (``InvalidArgumentError`` for anything but ``None`` or an integer >= 0).

    Chunks of one shape, dtype and device share a pool that grows by doubling up to
    ``capacity``; a chunk of another format empties the cache and starts a new pool. ``get``
    returns views of pool slots: a slot is not reused while the tensor ``get`` returned for it
    is alive (a chunk that finds no reusable slot is not cached), so a chunk once handed out
    never changes under its holder. Views the holder derives from it are not tracked.
    """

    def __init__(self, capacity: int | None) -> None:
        self.capacity = _checked_capacity(capacity)
        self._chunks: OrderedDict[ChunkKey, int] = OrderedDict()  # key -> slot, LRU first
        self._slots: list[torch.Tensor] = []  # one view per slot of the pool tensors
        self._free: list[int] = []  # slots no holder sees
        self._released: set[int] = set()  # unkeyed slots a holder may still see (claimed)
        self._slot_of: dict[int, int] = {}  # a slot's data_ptr -> the slot
        self._format: _Format | None = None  # the slots' chunk format
        self._handed: dict[int, weakref.ref[torch.Tensor]] = {}  # slot -> tensor from get
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
        return [self._hand(self._chunks[key]) for key in keys]

    def touch(self, keys: Sequence[ChunkKey]) -> None:
        """Mark the cached ``keys`` used, the first most recently: a prefix outlives its tail."""
        for key in reversed(keys):
            if key in self._chunks:
                self._chunks.move_to_end(key)

    def claim(
        self, count: int, shape: Sequence[int], dtype: torch.dtype, device: torch.device
    ) -> list[torch.Tensor]:
        """``count`` chunk tensors for the caller to fill, then ``put`` without a copy (e.g.
        the destination of a load from host): free slots, made by evicting the least recently
        used chunks where needed, else new tensors. A claimed slot unused goes back to the
        pool once its tensor is dropped."""
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise InvalidArgumentError(f"claim: count must be an integer >= 0, got {shown(count)}")
        fmt = _Format(torch.Size(shape), dtype, torch.device(device))
        self._recycle()
        slots = self._slots_for(fmt, count) if self.capacity != 0 else []
        self._released.update(slots)
        claimed = [self._hand(slot) for slot in slots]
        spare = count - len(slots)  # no slot left that no holder sees: memory of their own
        return claimed + [torch.empty(fmt.shape, dtype=dtype, device=device) for _ in range(spare)]

    def put(self, keys: Sequence[ChunkKey], chunks: Sequence[torch.Tensor]) -> None:
        """Cache ``chunks`` under ``keys`` (the first most recently used), evicting the least
        recently used beyond capacity; a chunk from ``claim`` takes its own slot, any other is
        copied into one."""
        if len(keys) != len(chunks):
            raise InvalidArgumentError(f"put: {len(keys)} keys for {len(chunks)} chunks")
        if not all(isinstance(chunk, torch.Tensor) for chunk in chunks):
            raise InvalidArgumentError("put: every chunk must be a tensor")
        if self.capacity == 0:
            return
        self._recycle()
        with torch.no_grad():  # a chunk that requires grad must not make the pool require it
            for key, chunk in zip(reversed(keys), reversed(chunks), strict=True):
                self._drop(key)
                slot = self._claimed_slot(chunk)
                if slot is None:
                    slot = self._slot_for(_format(chunk))
                    if slot is None:
                        continue
                    self._slots[slot].copy_(chunk)
                self._chunks[key] = slot

    def _recycle(self) -> None:
        """Unkeyed slots whose holders are gone back to the free list (once per call: a slot
        released during a call is held, as claimed, or freed at once by ``_drop``)."""
        if self._released:
            unheld = {slot for slot in self._released if not self._held(slot)}
            self._free += unheld
            self._released -= unheld

    def _drop(self, key: ChunkKey) -> None:
        slot = self._chunks.pop(key, None)
        if slot is not None:
            (self._released.add if self._held(slot) else self._free.append)(slot)

    def _claimed_slot(self, chunk: torch.Tensor) -> int | None:
        """The unkeyed slot ``chunk`` is (from ``claim``, or dropped), taken back; else None."""
        slot = self._slot_of.get(chunk.data_ptr())
        if slot not in self._released or _format(chunk) != self._format:
            return None
        self._released.discard(slot)
        return slot

    def _slot_for(self, fmt: _Format) -> int | None:
        """A slot no holder sees, for a chunk of format ``fmt``; ``None`` if there is none."""
        return next(iter(self._slots_for(fmt, 1)), None)

    def _slots_for(self, fmt: _Format, count: int) -> list[int]:
        """Up to ``count`` slots no holder sees, for chunks of format ``fmt``: free ones (the
        lowest first), then new ones up to capacity, then those of the least recently used
        chunks, evicted."""
        if fmt != self._format:
            self._reset()
            self._format = fmt
        slots: list[int] = []
        while len(slots) < count and (self._free or self._can_grow()):
            if not self._free:
                self._grow(fmt)
            take = min(count - len(slots), len(self._free))
            slots += reversed(self._free[-take:])
            del self._free[-take:]
        return slots + self._evict(count - len(slots))

    def _can_grow(self) -> bool:
        return self.capacity is None or len(self._slots) < self.capacity

    def _evict(self, count: int) -> list[int]:
        """The slots of up to ``count`` least recently used chunks no holder sees, evicted."""
        victims: list[ChunkKey] = []
        for key, slot in self._chunks.items():
            if len(victims) == count:
                break
            if not self._held(slot):
                victims.append(key)
        self.num_evicted += len(victims)
        return [self._chunks.pop(key) for key in victims]

    def _hand(self, slot: int) -> torch.Tensor:
        """A new tensor of ``slot``, tracked: the slot is not reused while it lives."""
        chunk = self._slots[slot].detach()
        self._handed[slot] = weakref.ref(chunk)
        return chunk

    def _held(self, slot: int) -> bool:
        ref = self._handed.get(slot)
        if ref is not None and ref() is None:
            del self._handed[slot]
            return False
        return ref is not None

    def _grow(self, fmt: _Format) -> None:
        """Double the pool (at most to ``capacity``) with a tensor of format ``fmt``."""
        count = max(_FIRST_SLOTS, len(self._slots))
        if self.capacity is not None:
            count = min(count, self.capacity - len(self._slots))
        with torch.inference_mode(False):  # a normal tensor: copied into in and out of it
            pool = torch.empty((count, *fmt.shape), dtype=fmt.dtype, device=fmt.device)
            first = len(self._slots)
            self._slots += pool.unbind(0)
        self._slot_of.update((self._slots[s].data_ptr(), s) for s in range(first, len(self._slots)))
        self._free += range(len(self._slots) - 1, first - 1, -1)  # lowest slot taken first

    def _reset(self) -> None:
        """Forget every chunk and pool tensor (held chunks keep their own memory alive)."""
        self._chunks.clear()
        self._slots, self._free, self._handed, self._slot_of = [], [], {}, {}
        self._released = set()


class _Format(NamedTuple):
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device


def _format(chunk: torch.Tensor) -> _Format:
    return _Format(chunk.shape, chunk.dtype, chunk.device)


def _checked_capacity(capacity: object) -> int | None:
    """``capacity`` as ``None`` or an int >= 0 (never a bool, a float or NaN)."""
    if capacity is None:
        return None
    if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral) or capacity < 0:
        raise InvalidArgumentError(
            f"capacity: expected None or an integer >= 0, got {shown(capacity)}"
        )
    return int(capacity)
