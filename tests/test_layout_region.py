"""KVLayout sizes and offsets; HostRegion alignment and zero-copy views."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

import numpy as np
import pytest
import torch

import kvtier.region as region_module
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


# -- the region's memory: private, huge-page advised, faulted in ahead ------------------------
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's madvise")


def resident_bytes(region: HostRegion) -> int:
    """Bytes of ``region``'s own pages resident in memory, by ``mincore`` over its range.

    Not smaps' ``Rss``: that counts a whole mapping, and the kernel merges a region's mapping
    with a neighbouring one of the same flags (another live region's), whose pages then count.
    """
    page = mmap.PAGESIZE
    base = region.numpy(0).ctypes.data
    length = region.nbytes
    vector = (ctypes.c_ubyte * (-(-length // page)))()
    mincore = ctypes.CDLL(None, use_errno=True).mincore
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if mincore(base, length, vector):
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(1 for entry in vector if entry & 1) * page


@linux_only
def test_region_pages_are_faulted_in_ahead_of_use():
    region = HostRegion(256, 256 * 1024, pin=False)  # 64 MiB, never written here
    assert region.wait_prefaulted(60)
    assert resident_bytes(region) >= region.nbytes


@linux_only
def test_prefault_changes_no_byte_and_faults_in_the_rest(monkeypatch, caplog):
    monkeypatch.setattr(region_module, "available_bytes", lambda: 0)  # no prefault thread
    region = HostRegion(16, 64 * 1024, pin=False)
    assert "not faulted in ahead" in caplog.text
    assert resident_bytes(region) == 0
    rng = np.random.default_rng(0)
    written = {s: rng.integers(0, 256, region.slot_bytes, dtype=np.uint8) for s in range(0, 16, 2)}
    for slot, data in written.items():
        region.numpy(slot)[:] = data
    for slot in range(16):
        assert region_module.prefault(np.frombuffer(region.aligned_view(slot), dtype=np.uint8))
    assert resident_bytes(region) >= region.nbytes
    for slot in range(16):
        expected = written.get(slot, np.zeros(region.slot_bytes, dtype=np.uint8))
        assert np.array_equal(region.numpy(slot), expected)


@pytest.mark.parametrize(("available", "ahead"), [(1 << 20, True), ((1 << 20) - 1, False)])
def test_a_region_is_faulted_in_ahead_only_if_it_fits_in_available_memory(
    monkeypatch, available, ahead
):
    monkeypatch.setattr(region_module, "available_bytes", lambda: available)
    region = HostRegion(16, 64 * 1024, pin=False)  # exactly 1 MiB
    assert (region._prefaulted is not None) == ahead
    assert region.wait_prefaulted(60)
    region.view(15)[:4] = b"used"  # usable either way
    assert bytes(region.numpy(15)[:4]) == b"used"


@pytest.mark.parametrize(("slots", "slot_bytes"), [(2**40, 2**20), (2**70, 1)])
def test_a_region_the_system_cannot_map_raises_memory_error(slots, slot_bytes):
    with pytest.raises(MemoryError, match="cannot map a host region"):
        HostRegion(slots, slot_bytes, pin=False)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_writes_its_own_copy_of_the_region():
    region = HostRegion(2, 4096, pin=False)
    region.view(0)[:4] = b"mine"
    pid = os.fork()
    if pid == 0:  # the child
        region.view(0)[:4] = b"kid!"
        os._exit(0 if bytes(region.view(0)[:4]) == b"kid!" else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert bytes(region.view(0)[:4]) == b"mine"
