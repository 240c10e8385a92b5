"""HostRegion: one aligned buffer of fixed-size slots, the meeting point of every tier.

The region is allocated once; each slot starts on a 4096-byte boundary (so O_DIRECT I/O works on
it) and ``view(slot)`` is a writable, zero-copy ``memoryview`` exactly ``slot_bytes`` long. When a
CUDA device is present the buffer is page-locked (pinned) so accelerator copies run async.

Thread safety: the region never changes shape; slots are owned by whoever the host tier gave them
to, so concurrent access to *different* slots needs no lock.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvtier.errors import CapacityError

ALIGNMENT = 4096


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _allocate(total: int, pin: bool) -> tuple[np.ndarray[Any, Any], Any]:
    """An aligned uint8 array of ``total`` bytes, and the torch tensor that owns it if pinned."""
    if pin:
        import torch

        owner = torch.empty(total + ALIGNMENT, dtype=torch.uint8, pin_memory=True)
        raw = owner.numpy()
    else:
        owner, raw = None, np.empty(total + ALIGNMENT, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start : start + total], owner


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class HostRegion:
    """``num_slots`` slots of ``slot_bytes`` each, ``stride`` bytes apart (a multiple of 4096)."""

    def __init__(self, num_slots: int, slot_bytes: int, *, pin: bool | None = None) -> None:
        if num_slots <= 0 or slot_bytes <= 0:
            raise CapacityError(
                f"a host region needs at least one slot of at least one byte "
                f"(got num_slots={num_slots}, slot_bytes={slot_bytes})"
            )
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.stride = round_up(slot_bytes, ALIGNMENT)
        self.pinned = cuda_available() if pin is None else pin
        self._array, self._owner = _allocate(num_slots * self.stride, self.pinned)
        self._buffer = memoryview(self._array)  # type: ignore[arg-type]

    @property
    def nbytes(self) -> int:
        return self.num_slots * self.stride

    def _check(self, slot: int) -> int:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.num_slots})")
        return slot * self.stride

    def view(self, slot: int) -> memoryview:
        """Writable zero-copy view of one slot, ``slot_bytes`` long."""
        start = self._check(slot)
        return self._buffer[start : start + self.slot_bytes]

    def aligned_view(self, slot: int) -> memoryview:
        """View of the whole ``stride`` bytes of a slot (for aligned, padded direct I/O)."""
        start = self._check(slot)
        return self._buffer[start : start + self.stride]

    def numpy(self, slot: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The slot as a uint8 numpy array sharing the region's memory."""
        start = self._check(slot)
        return self._array[start : start + self.slot_bytes]

    def rows(self) -> Any:
        """Every slot at once: a ``(num_slots, slot_bytes)`` uint8 torch tensor sharing the
        region's memory, row ``i`` being slot ``i`` (for batched copies)."""
        import torch

        whole = torch.from_numpy(self._array)
        if self._owner is not None:
            base = self._array.ctypes.data - self._owner.data_ptr()
            whole = self._owner[base : base + self.nbytes]
        return whole.view(self.num_slots, self.stride)[:, : self.slot_bytes]

    def tensor(self, slot: int) -> Any:
        """The slot as a uint8 torch tensor sharing the region's memory (pinned when CUDA is)."""
        import torch

        start = self._check(slot)
        if self._owner is not None:
            base = self._array.ctypes.data - self._owner.data_ptr()
            return self._owner[base + start : base + start + self.slot_bytes]
        return torch.from_numpy(self.numpy(slot))
