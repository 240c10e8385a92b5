"""HostRegion: one aligned buffer of fixed-size slots, the meeting point of every tier.

The region is allocated once; each slot starts on a 4096-byte boundary (so O_DIRECT I/O works on
it) and ``view(slot)`` is a writable, zero-copy ``memoryview`` exactly ``slot_bytes`` long. When a
CUDA device is present the buffer is page-locked (pinned) so accelerator copies run async.

Otherwise it is private anonymous memory, aligned to 2 MiB and advised for transparent huge
pages, whose pages a background thread faults in once (``prefault``: Linux's
``MADV_POPULATE_WRITE``, which never changes a byte, so the region is usable at once). Without
that, the first store into each slot paid its page faults on the engine's thread: 250 µs per
128 KiB slot inside ``make bench`` on this project's 2-vCPU VM, against 30 µs for a slot
already faulted in; 206 of the 216 ms its 672 stores spent copying.

Thread safety: the region never changes shape; slots are owned by whoever the host tier gave them
to, so concurrent access to *different* slots needs no lock.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import sys
import threading
from typing import Any

import numpy as np

from kvtier.errors import CapacityError

ALIGNMENT = 4096
HUGE_PAGE = 2 << 20
#: Linux 5.14's madvise advice (Python's ``mmap`` names it from 3.13 on): fault pages in,
#: writable, keeping their contents.
MADV_POPULATE_WRITE = 23
#: Bytes per madvise call of the prefault thread (the GIL is released during each).
PREFAULT_STEP = 64 << 20

log = logging.getLogger(__name__)


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _allocate(total: int, pin: bool) -> tuple[np.ndarray[Any, Any], Any]:
    """An aligned uint8 array of ``total`` bytes, and the torch tensor that owns it if pinned
    (an anonymous mapping stays alive as long as the array, its base)."""
    if pin:
        import torch

        owner = torch.empty(total + ALIGNMENT, dtype=torch.uint8, pin_memory=True)
        raw = owner.numpy()
        start = (-raw.ctypes.data) % ALIGNMENT
        return raw[start : start + total], owner
    return _anonymous(total), None


def _anonymous(total: int) -> np.ndarray[Any, Any]:
    """``total`` bytes of private anonymous memory, 2 MiB aligned, advised for huge pages;
    ``MemoryError`` when the system refuses the mapping."""
    try:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # private: a forked child copies on write
        mapping = mmap.mmap(-1, round_up(total, HUGE_PAGE) + HUGE_PAGE, flags=flags)
    except (OSError, OverflowError) as exc:
        raise MemoryError(f"cannot map a host region of {total} bytes: {exc}") from exc
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(mapping, dtype=np.uint8)
    start = (-raw.ctypes.data) % HUGE_PAGE
    return raw[start : start + total]


def prefault(array: np.ndarray[Any, Any]) -> bool:
    """Fault every page of ``array`` (page-aligned, of whole pages) in, writable, without
    changing a byte, so that other threads may use it meanwhile. False where the kernel cannot
    (not Linux, or older than 5.14): its pages then fault in on first use, as before.

    Releases the GIL during each ``PREFAULT_STEP`` bytes."""
    if not sys.platform.startswith("linux"):
        return False
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base, total = array.ctypes.data, array.nbytes
    for offset in range(0, total, PREFAULT_STEP):
        if madvise(base + offset, min(PREFAULT_STEP, total - offset), MADV_POPULATE_WRITE):
            return False
    return True


def available_bytes() -> int | None:
    """The kernel's estimate of memory available without swapping (``MemAvailable``), or None
    where it does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class HostRegion:
    """``num_slots`` slots of ``slot_bytes`` each, ``stride`` bytes apart (a multiple of 4096).

    ``MemoryError`` if the memory cannot be had. An unpinned region's pages are faulted in by
    the daemon thread ``kvtier-region-prefault``, unless the region is larger than the memory
    available at start (then they fault in on first use, and a warning says so)."""

    _prefaulted: threading.Event | None = None

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
        if not self.pinned:
            self._start_prefault()

    def _start_prefault(self) -> None:
        available = available_bytes()
        if available is not None and self.nbytes > available:
            log.warning(
                "host region of %d bytes is larger than the %d bytes of memory available: "
                "its pages are not faulted in ahead",
                self.nbytes,
                available,
            )
            return
        done, array = threading.Event(), self._array

        def run() -> None:
            prefault(array)
            done.set()

        self._prefaulted = done
        threading.Thread(target=run, name="kvtier-region-prefault", daemon=True).start()

    def wait_prefaulted(self, timeout: float | None = None) -> bool:
        """Whether the prefault thread has finished (waiting up to ``timeout`` seconds); True
        for a region with none (pinned, or another's memory). For tests and benchmarks: the
        region is usable all along."""
        return self._prefaulted is None or self._prefaulted.wait(timeout)

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
