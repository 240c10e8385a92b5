"""KVLayout sizes and offsets; HostRegion alignment and zero-copy views."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvtier import CapacityError, ConfigError, KVLayout
from kvtier.region import ALIGNMENT, HostRegion


def test_layout_sizes_and_page_offsets():
    layout = KVLayout(
        num_layers=3, num_kv_heads=2, head_dim=4, dtype="float16", block_size=8, blocks_per_chunk=2
    )
    assert layout.head_bytes == 8 * 4 * 2
    assert layout.page_bytes == 2 * 2 * layout.head_bytes
    assert layout.chunk_bytes == 3 * 2 * layout.page_bytes
    assert layout.tokens_per_chunk == 16
    offsets = [layout.page_offset(l, b) for l in range(3) for b in range(2)]
    assert offsets == [i * layout.page_bytes for i in range(6)]
    with pytest.raises(IndexError):
        layout.page_offset(3, 0)


@pytest.mark.parametrize(
    ("field", "value"), [("num_layers", 0), ("head_dim", -1), ("dtype", "float64")]
)
def test_layout_rejects_impossible_shapes(field, value):
    kwargs = {"num_layers": 1, "num_kv_heads": 1, "head_dim": 1, field: value}
    with pytest.raises(ConfigError, match=field):
        KVLayout(**kwargs)


def test_region_slots_are_aligned_and_disjoint():
    region = HostRegion(5, 5000, pin=False)
    assert region.stride % ALIGNMENT == 0 and region.stride >= 5000
    for slot in range(5):
        assert region.numpy(slot).ctypes.data % ALIGNMENT == 0
        region.view(slot)[:] = bytes([slot + 1]) * 5000
    assert all(bytes(region.view(s)) == bytes([s + 1]) * 5000 for s in range(5))
    assert len(region.view(0)) == 5000 and len(region.aligned_view(0)) == region.stride


def test_region_views_share_memory_without_copying():
    region = HostRegion(2, 64, pin=False)
    region.view(1)[:4] = b"abcd"
    assert bytes(region.numpy(1)[:4]) == b"abcd"
    tensor = region.tensor(1)
    assert tensor.dtype == torch.uint8 and tensor.shape == (64,)
    tensor[:4] = torch.tensor(list(b"wxyz"), dtype=torch.uint8)
    assert bytes(region.view(1)[:4]) == b"wxyz"
    region.numpy(1)[4:8] = np.frombuffer(b"1234", dtype=np.uint8)
    assert bytes(tensor[4:8].numpy()) == b"1234"


def test_region_bounds():
    region = HostRegion(2, 64, pin=False)
    with pytest.raises(IndexError):
        region.view(2)
    with pytest.raises(CapacityError):
        HostRegion(0, 64)
