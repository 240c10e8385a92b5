"""SpanRegion: kvtier's ``HostRegion`` interface over SGLang's host pool pages, with no copy.

SGLang's host pool (its L2) owns the memory. For a batch of pages, its
``get_page_buffer_meta(host_indices)`` gives one pointer and size per span of each page: two
spans (K and V) per page for MHA in the page_first layouts, one for MLA, two per layer in
layer_first; every span of a pool has the same size. Each span is one kvtier chunk, and a
kvtier slot of this region *is* one span: ``lend`` maps a batch's spans to free slot numbers,
the tiers read and write ``view(slot)`` in place (the pool's own bytes), and ``give_back`` frees
the numbers once the batch's jobs have reported. Generic (copying) calls lend the spans of the
page tensors SGLang hands them in the same way.

Slot numbers are only names here: ``stride`` is the span size and nothing is aligned for
O_DIRECT (``direct_io_capable`` is false; SGLang's pointers carry no alignment promise).

Thread safety: ``lend`` and ``give_back`` take the region's lock (SGLang's prefetch, backup
and load threads lend at once); a lent slot is used only by the jobs of the call that lent it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvtier.errors import CapacityError
from kvtier.region import HostRegion

#: Slot numbers the region can lend at once (three SGLang threads, 128 pages each, a few
#: spans per page, with room to spare); ``lend`` beyond it raises ``CapacityError``.
MAX_LENT = 1 << 20


class SpanRegion(HostRegion):
    """Spans of ``span_bytes`` each, lent as kvtier slots (see the module docstring)."""

    direct_io_capable = False

    def __init__(self, span_bytes: int) -> None:  # no super(): SGLang owns the memory
        if span_bytes <= 0:
            raise CapacityError(f"host pool spans of {span_bytes} bytes")
        self.num_slots, self.slot_bytes, self.stride = MAX_LENT, span_bytes, span_bytes
        self.pinned = False
        self._owner = None
        self._lock = threading.Lock()
        self._arrays: dict[int, np.ndarray[Any, np.dtype[np.uint8]]] = {}
        self._free: list[int] = []
        self._next = 0

    @property
    def nbytes(self) -> int:
        return len(self._arrays) * self.slot_bytes

    def lend(self, pointers: Sequence[int], sizes: Sequence[int]) -> list[int]:
        """Slots for the spans at ``pointers`` (each ``sizes[i]`` bytes, which must be the
        region's span size: ``CapacityError`` otherwise, nothing lent)."""
        if any(int(size) != self.slot_bytes for size in sizes) or len(sizes) != len(pointers):
            raise CapacityError(f"host pool spans are not all {self.slot_bytes} bytes")
        arrays = [_span(int(p), self.slot_bytes) for p in pointers]
        with self._lock:
            if len(self._arrays) + len(arrays) > MAX_LENT:
                raise CapacityError("too many host pool spans lent at once")
            slots = [self._take() for _ in arrays]
            self._arrays.update(zip(slots, arrays, strict=True))
        return slots

    def _take(self) -> int:
        if self._free:
            return self._free.pop()
        self._next += 1
        return self._next - 1

    def give_back(self, slots: Sequence[int]) -> None:
        """Forget ``slots`` (their jobs have reported); their numbers are lent again later."""
        with self._lock:
            for slot in slots:
                if self._arrays.pop(slot, None) is not None:
                    self._free.append(slot)

    def numpy(self, slot: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        try:
            return self._arrays[slot]
        except KeyError:
            raise IndexError(f"slot {slot} is not lent") from None

    def view(self, slot: int) -> memoryview:
        return memoryview(self.numpy(slot))  # type: ignore[arg-type]

    def aligned_view(self, slot: int) -> memoryview:
        return self.view(slot)

    def tensor(self, slot: int) -> Any:
        import torch

        return torch.from_numpy(self.numpy(slot))

    def rows(self) -> Any:
        raise NotImplementedError("a SpanRegion lends spans; it has no rows")


def _span(pointer: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A uint8 array over ``nbytes`` at ``pointer`` (memory the host pool keeps alive)."""
    if pointer <= 0:
        raise CapacityError(f"host pool span at address {pointer}")
    buffer = (ctypes.c_uint8 * nbytes).from_address(pointer)
    return np.frombuffer(memoryview(buffer).cast("B"), dtype=np.uint8)
