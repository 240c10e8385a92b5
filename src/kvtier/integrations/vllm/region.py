"""PrimaryRegion: kvtier's ``HostRegion`` interface over vLLM's primary host view, with no copy.

vLLM's tiering spec hands every secondary tier ``primary_kv_view``: a 2-D memoryview (chunks x
row stride, format ``b``) over the shared ``/dev/shm`` region that its CPU primary tier owns.
kvtier's tiers read and write host slots through ``region.view(slot)`` (and ``aligned_view``,
``numpy``), so a ``PrimaryRegion`` answers those for vLLM's rows: slot ``c`` *is* chunk ``c`` of
vLLM's view, and every view is a slice of it, never a copy.

Rows of a 2-D memoryview cannot be indexed (``view[c]`` raises NotImplementedError); the region
casts the view to one flat byte view once and slices that. ``release()`` must run when the tier
has stopped (no slice may outlive it): vLLM's region cleanup raises BufferError while exports of
its mmap are alive.

Thread safety: as ``HostRegion``: the shape never changes and slots are owned by whoever vLLM
gave them to, so different threads may use different slots at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvtier.errors import CapacityError
from kvtier.region import ALIGNMENT, HostRegion


class PrimaryRegion(HostRegion):
    """``num_slots`` rows of ``stride`` bytes of vLLM's primary view, one kvtier slot per row."""

    def __init__(self, primary_kv_view: memoryview) -> None:  # no super(): nothing to allocate
        if primary_kv_view.ndim != 2 or not primary_kv_view.shape or not primary_kv_view.strides:
            raise CapacityError("primary_kv_view: expected a 2-D view (chunks x row bytes)")
        num_slots, stride = primary_kv_view.shape[0], primary_kv_view.strides[0]
        if num_slots <= 0 or stride <= 0:
            raise CapacityError(f"primary_kv_view: no chunks (shape {primary_kv_view.shape})")
        self.num_slots, self.slot_bytes, self.stride = num_slots, stride, stride
        self.pinned = False
        self._owner = None
        self._buffer = primary_kv_view.cast("B")
        self._array = np.frombuffer(self._buffer, dtype=np.uint8)

    @property
    def direct_io_capable(self) -> bool:
        """Rows start and end on 4096-byte boundaries, so O_DIRECT may read into them."""
        base = self._array.ctypes.data
        return base % ALIGNMENT == 0 and self.stride % ALIGNMENT == 0

    def tensor(self, slot: int) -> Any:
        import torch

        return torch.from_numpy(self.numpy(slot))

    def release(self) -> None:
        """Drop this region's exports of vLLM's view; call after the tier stopped for good."""
        self._array = np.empty(0, dtype=np.uint8)
        self._buffer.release()
