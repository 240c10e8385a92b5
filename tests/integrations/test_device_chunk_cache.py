"""DeviceChunkCache as a slot pool: what a holder sees never changes, slots are reused only
once nobody holds them, and claimed slots take loads without a copy."""

from __future__ import annotations

import gc

import pytest
import torch

from kvtier.errors import InvalidArgumentError
from kvtier.integrations.transformers import DeviceChunkCache

SHAPE = (2, 3)
CPU = torch.device("cpu")


def chunk(value: float) -> torch.Tensor:
    return torch.full(SHAPE, value)


def values(chunks: list[torch.Tensor]) -> list[float]:
    return [float(c[0, 0]) for c in chunks]


def test_put_copies_so_a_later_change_to_the_source_is_not_seen() -> None:
    cache = DeviceChunkCache(4)
    source = chunk(1.0)
    cache.put(["a"], [source])
    source.fill_(5.0)
    assert values(cache.get(["a"])) == [1.0]


def test_a_chunk_handed_out_is_never_overwritten_while_held() -> None:
    """Capacity 2, chunk a held: filling the cache evicts b, never a's slot; the chunk that
    finds no slot a holder does not see is not cached."""
    cache = DeviceChunkCache(2)
    cache.put(["a", "b"], [chunk(1.0), chunk(2.0)])
    held = cache.get(["a"])
    cache.touch(["b"])  # a is now the least recently used: the first an eviction would take
    cache.put(["c"], [chunk(3.0)])
    assert values(held) == [1.0]
    assert cache.match(["a"]) == 1 and cache.match(["b"]) == 0 and cache.num_evicted == 1
    cache.put(["d"], [chunk(4.0)])  # a held, c is the only other: c goes
    assert values(held) == [1.0] and cache.match(["d"]) == 1 and cache.match(["c"]) == 0
    cache.put(["e"], [chunk(5.0)])
    assert values(held) == [1.0] and values(cache.get(["e"])) == [5.0] and len(cache) == 2


def test_once_let_go_a_held_chunk_is_evicted_like_any_other() -> None:
    cache = DeviceChunkCache(2)
    cache.put(["a", "b"], [chunk(1.0), chunk(2.0)])
    held = cache.get(["a"])
    cache.touch(["b"])
    del held
    gc.collect()
    cache.put(["c"], [chunk(3.0)])
    assert cache.match(["a"]) == 0 and cache.match(["b"]) == 1 and cache.match(["c"]) == 1
    assert values(cache.get(["b", "c"])) == [2.0, 3.0]


def test_when_every_slot_is_held_a_put_caches_nothing_and_changes_nothing() -> None:
    cache = DeviceChunkCache(2)
    cache.put(["a", "b"], [chunk(1.0), chunk(2.0)])
    held = cache.get(["a", "b"])
    cache.put(["c"], [chunk(3.0)])
    assert cache.match(["c"]) == 0 and len(cache) == 2 and values(held) == [1.0, 2.0]


def test_replacing_a_held_chunk_leaves_the_holder_its_old_content() -> None:
    cache = DeviceChunkCache(3)
    cache.put(["a"], [chunk(1.0)])
    held = cache.get(["a"])
    cache.put(["a"], [chunk(7.0)])
    assert values(held) == [1.0] and values(cache.get(["a"])) == [7.0] and len(cache) == 1


def test_a_claimed_chunk_is_cached_in_its_own_slot_without_a_copy() -> None:
    cache = DeviceChunkCache(3)
    claimed = cache.claim(2, SHAPE, torch.float32, CPU)
    for tensor, value in zip(claimed, (1.0, 2.0), strict=True):
        tensor.fill_(value)
    cache.put(["a", "b"], claimed)
    got = cache.get(["a", "b"])
    assert values(got) == [1.0, 2.0]
    assert [t.data_ptr() for t in got] == [t.data_ptr() for t in claimed]


def test_claims_evict_the_least_recently_used_and_stay_within_capacity() -> None:
    cache = DeviceChunkCache(2)
    cache.put(["a", "b"], [chunk(1.0), chunk(2.0)])
    cache.touch(["a"])
    claimed = cache.claim(1, SHAPE, torch.float32, CPU)
    assert cache.match(["b"]) == 0 and cache.match(["a"]) == 1 and cache.num_evicted == 1
    claimed[0].fill_(3.0)
    cache.put(["c"], claimed)
    assert len(cache) == 2 and values(cache.get(["a", "c"])) == [1.0, 3.0]


def test_a_claimed_slot_left_unused_goes_back_once_dropped() -> None:
    """Claimed and dropped (a load that failed): the next claim takes it, evicting nothing."""
    cache = DeviceChunkCache(2)
    cache.put(["a"], [chunk(1.0)])
    claimed = cache.claim(1, SHAPE, torch.float32, CPU)
    second = cache.claim(1, SHAPE, torch.float32, CPU)  # the first is held: evicts a
    assert cache.num_evicted == 1 and cache.match(["a"]) == 0
    pointer = claimed[0].data_ptr()
    del claimed
    gc.collect()
    third = cache.claim(1, SHAPE, torch.float32, CPU)
    assert cache.num_evicted == 1 and third[0].data_ptr() == pointer
    assert second[0].data_ptr() != pointer


def test_claims_beyond_every_free_slot_get_tensors_of_their_own() -> None:
    cache = DeviceChunkCache(1)
    claimed = cache.claim(3, SHAPE, torch.float32, CPU)
    assert len({t.data_ptr() for t in claimed}) == 3
    assert all(t.shape == SHAPE and t.dtype == torch.float32 for t in claimed)
    for tensor, value in zip(claimed, (1.0, 2.0, 3.0), strict=True):
        tensor.fill_(value)
    cache.put(["a", "b", "c"], claimed)  # the first is the most recently used: it stays
    assert cache.match(["a"]) == 1 and len(cache) == 1 and values(cache.get(["a"])) == [1.0]


def test_a_chunk_of_another_format_empties_the_cache_and_starts_a_new_pool() -> None:
    cache = DeviceChunkCache(4)
    cache.put(["a", "b"], [chunk(1.0), chunk(2.0)])
    held = cache.get(["a"])
    cache.put(["c"], [torch.full((5,), 3.0, dtype=torch.float64)])
    assert cache.match(["a"]) == 0 and cache.match(["b"]) == 0 and len(cache) == 1
    assert values(held) == [1.0]
    got = cache.get(["c"])[0]
    assert got.dtype == torch.float64 and got.shape == (5,) and float(got[0]) == 3.0


def test_without_a_capacity_the_pool_grows_and_keeps_everything() -> None:
    cache = DeviceChunkCache(None)
    keys = [f"k{i}" for i in range(100)]
    cache.put(keys, [chunk(float(i)) for i in range(100)])
    assert cache.match(keys) == 100 and cache.num_evicted == 0
    assert values(cache.get(keys)) == [float(i) for i in range(100)]


def test_capacity_zero_keeps_nothing_and_claims_fresh_tensors() -> None:
    cache = DeviceChunkCache(0)
    claimed = cache.claim(2, SHAPE, torch.float32, CPU)
    cache.put(["a", "b"], claimed)
    assert len(cache) == 0 and len(claimed) == 2 and claimed[0].shape == SHAPE


@pytest.mark.parametrize(
    ("keys", "chunks"),
    [(["a", "b"], [chunk(1.0)]), (["a"], [chunk(1.0), chunk(2.0)]), (["a"], [1.0])],
)
def test_a_bad_put_is_refused_before_anything_is_cached(
    keys: list[str], chunks: list[object]
) -> None:
    cache = DeviceChunkCache(4)
    with pytest.raises(InvalidArgumentError):
        cache.put(keys, chunks)
    assert len(cache) == 0


@pytest.mark.parametrize("count", [-1, 1.5, True, "2"])
def test_a_bad_claim_count_is_refused(count: object) -> None:
    with pytest.raises(InvalidArgumentError, match="count"):
        DeviceChunkCache(2).claim(count, SHAPE, torch.float32, CPU)  # type: ignore[arg-type]


def test_a_chunk_that_requires_grad_is_cached_as_data() -> None:
    cache = DeviceChunkCache(2)
    cache.put(["a"], [torch.ones(SHAPE, requires_grad=True)])
    (got,) = cache.get(["a"])
    assert not got.requires_grad and values([got]) == [1.0]
    cache.put(["b"], [chunk(2.0)])  # an in-place copy into the pool still works
    assert values(cache.get(["b"])) == [2.0]
