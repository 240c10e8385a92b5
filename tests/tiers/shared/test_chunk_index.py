"""ChunkIndex: unreachable chunks first, a prefix evicted from its tail, the bound kept.

A reference model (plain lists and a recompute of reachability from scratch) is checked
against the index over random operation sequences.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.errors import CapacityError
from kvtier.keys import ChunkKey
from kvtier.tiers.shared import drops
from kvtier.tiers.shared.chunk_index import ChunkIndex


def k(i: int) -> ChunkKey:
    return ChunkKey(i.to_bytes(32, "big"))


def chain(index: ChunkIndex, ids: list[int], size: int = 10) -> None:
    """Store chunks ``ids`` as one prefix, head first, as a tier does."""
    for i, key in enumerate(ids):
        index.add(k(key), size, k(ids[i - 1]) if i else None)
    index.touch_many([k(i) for i in ids])


def test_a_prefix_is_evicted_from_its_tail_never_its_head() -> None:
    index = ChunkIndex(max_bytes=50)
    chain(index, [1, 2, 3, 4, 5])
    victims = index.add(k(9), 10)  # one more chunk: one must go
    assert victims == [k(5)]
    assert index.add(k(10), 10) == [k(4)]


def test_touching_a_tail_keeps_its_head_more_recent() -> None:
    index = ChunkIndex(max_bytes=40)
    chain(index, [1, 2, 3])
    index.add(k(7), 10)  # an unrelated chunk, newer than the chain
    index.touch(k(3))  # a later use of the whole prefix
    assert index.add(k(8), 10) == [k(7)]


def test_a_chunk_whose_predecessor_is_gone_goes_before_older_reachable_ones() -> None:
    index = ChunkIndex(max_bytes=40)
    index.add(k(100), 10)  # oldest, reachable
    chain(index, [1, 2, 3])
    index.discard(k(1))  # the head is gone: 2 and 3 can never be served
    assert index.unreachable_count() == 2
    assert index.add(k(8), 10) == []
    assert index.add(k(9), 10) + index.add(k(10), 10) == [k(2), k(3)]
    assert k(100) in index


def test_storing_a_lost_head_again_makes_its_tail_reachable() -> None:
    index = ChunkIndex(max_bytes=None)
    chain(index, [1, 2, 3])
    index.discard(k(1))
    assert index.unreachable_count() == 2
    index.add(k(1), 10)
    assert index.unreachable_count() == 0


def test_a_chunk_added_after_its_parent_was_lost_is_unreachable_at_once() -> None:
    index = ChunkIndex(max_bytes=None)
    index.add(k(2), 10, k(1))
    assert index.unreachable_count() == 1
    index.set_parent(k(2), None)  # learnt nothing: stays as it was
    assert index.unreachable_count() == 1


def test_merge_cold_puts_every_head_after_its_tail_whatever_the_listing_order() -> None:
    index = ChunkIndex(max_bytes=30)
    # oldest first by mtime: the head was written first, so a plain LRU would drop it first
    found = [(k(1), 10, None), (k(2), 10, k(1)), (k(3), 10, k(2)), (k(4), 10, None)]
    assert index.merge_cold(found) == [k(3)]


def test_merge_cold_evicts_orphans_first() -> None:
    index = ChunkIndex(max_bytes=20)
    found = [(k(5), 10, None), (k(6), 10, None), (k(3), 10, k(2))]  # 3's parent is not there
    assert index.merge_cold(found) == [k(3)]


def test_reservations_count_against_the_bound_on_both_sides_of_it() -> None:
    index = ChunkIndex(max_bytes=20)
    assert index.reserve(20) == []
    with pytest.raises(CapacityError):
        index.reserve(1)
    index.commit(k(1), 20)
    assert index.reserve(20) == [k(1)]
    index.release(20)
    assert index.used_bytes == 0


# -- reference model ---------------------------------------------------------------------
class Model:
    """What the index must say: held chunks, their parents, and recency (list order)."""

    def __init__(self, bound: int) -> None:
        self.bound, self.order, self.parent, self.lost_order = bound, [], {}, []
        self.size: dict[int, int] = {}

    def reachable(self, key: int) -> bool:
        seen = set()
        while key in self.size and key not in seen:
            seen.add(key)
            parent = self.parent.get(key)
            if parent is None:
                return True
            key = parent
        return False


ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "discard", "touch"]), st.integers(0, 11), st.integers(-1, 11)
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_index_keeps_the_bound_and_never_evicts_a_reachable_chunk_before_an_orphan(
    steps: list[tuple[str, int, int]],
) -> None:
    index, model = ChunkIndex(max_bytes=50), Model(50)
    for op, key, parent in steps:
        if op == "add":
            p = parent if 0 <= parent < key else None  # a chain of sha256 keys has no cycle
            victims = index.add(k(key), 10, k(p) if p is not None else None)
            if key not in model.size:
                model.size[key] = 10
                model.parent.pop(key, None)
            if p is not None:
                model.parent[key] = p
            lost = {x for x in model.size if not model.reachable(x)}
            if victims and lost:  # an orphan goes before any reachable chunk
                assert int.from_bytes(victims[0], "big") in lost
            for v in victims:
                del model.size[int.from_bytes(v, "big")]
        elif op == "discard":
            assert index.discard(k(key)) == (key in model.size)
            model.size.pop(key, None)
            model.parent.pop(key, None)
        else:
            assert index.touch(k(key)) == (key in model.size)
        assert index.used_bytes == sum(model.size.values()) <= 50
        lost = {x for x in model.size if not model.reachable(x)}
        assert index.unreachable_count() == len(lost)


def test_a_prefix_longer_than_the_bound_keeps_its_head_and_skips_its_tail() -> None:
    index = ChunkIndex(max_bytes=30)
    index.add(k(50), 10)  # an older, unrelated chunk goes first
    written = []
    for i in range(1, 6):
        parent = k(i - 1) if i > 1 else None
        victims = index.reserve(10, parent)
        if victims is None:
            continue
        assert k(i - 1) not in victims
        index.commit(k(i), 10, parent)
        written.append(i)
    assert written == [1, 2, 3] and k(50) not in index
    assert index.used_bytes == 30 and index.unreachable_count() == 0


def test_reserve_for_a_head_or_without_a_bound_never_refuses() -> None:
    unbounded = ChunkIndex(max_bytes=None)
    unbounded.add(k(1), 10)
    assert unbounded.reserve(10, k(1)) == []
    bounded = ChunkIndex(max_bytes=10)
    bounded.add(k(1), 10)
    assert bounded.reserve(10, None) == [k(1)]


def test_a_chunk_whose_parent_is_still_being_written_counts_its_parent_as_held() -> None:
    index = ChunkIndex(max_bytes=30)
    index.add(k(50), 10)
    index.add(k(51), 10)
    assert index.reserve(10, None, k(1)) == []  # the head: being written by one thread
    victims = index.reserve(10, k(1), k(2))  # its next chunk, on another thread
    assert victims == [k(50)]
    index.commit(k(2), 10, k(1))
    index.commit(k(1), 10)
    assert index.unreachable_count() == 0 and index.used_bytes == 30


def test_a_released_parent_leaves_its_child_an_orphan_again() -> None:
    index = ChunkIndex(max_bytes=20)
    index.add(k(50), 10)
    index.add(k(51), 10)
    index.reserve(10, None, k(1))
    index.release(10, k(1))
    index.add(k(52), 10)  # full again
    assert index.reserve(10, k(1), k(2)) is None  # would evict a reachable chunk for an orphan


def test_a_chunk_reserved_before_its_announced_parent_is_not_an_orphan() -> None:
    """Two jobs of one chain on two threads: the second job's first chunk may reserve before
    the first job's last one. Announced at submit (``expect``), its parent counts as held."""
    index = ChunkIndex(max_bytes=20)
    index.add(k(50), 10)
    index.add(k(51), 10)
    index.expect([(k(1), None), (k(2), k(1))])  # job 1, submitted first
    index.expect([(k(3), k(2))])  # job 2
    assert index.reserve(10, k(2), k(3)) == [k(50)]  # job 2 runs first: stored, not skipped
    index.forget([k(1), k(2)])  # job 1 ended without writing: k(3)'s parent is gone
    assert index.reserve(10, k(2), k(4)) is None  # an orphan again: nothing evicted for it


def test_forget_leaves_no_announcement_behind() -> None:
    index = ChunkIndex(max_bytes=20)
    index.add(k(50), 10)
    index.add(k(51), 10)
    index.expect([(k(1), None)])
    index.forget([k(1)])
    assert index.reserve(10, k(1), k(2)) is None


@pytest.mark.parametrize("found_by", ["listing", "probe"])
def test_a_chunk_found_while_it_is_written_counts_once(found_by: str) -> None:
    """A listing (or a probe) that sees a put still in flight must not index it beside its
    reservation: its bytes would count twice and evict (or skip) a chunk for nothing."""
    index = ChunkIndex(max_bytes=30)
    assert index.reserve(10, None, k(1)) == []
    assert index.reserve(10, k(1), k(2)) == []
    if found_by == "listing":
        assert index.merge_cold([(k(1), 10, None)]) == []
    else:
        assert index.add(k(1), 10) == []
    assert index.reserve(10, k(2), k(3)) == []  # 30 of 30: room without evicting
    for key, parent in ((k(1), None), (k(2), k(1)), (k(3), k(2))):
        index.commit(key, 10, parent)
    assert index.used_bytes == 30 and len(index) == 3


def test_a_key_two_jobs_write_stays_pending_until_both_end() -> None:
    """Two requests store the same prefix at once: the first job to end must not take the
    other's mark, or the other's next chunk is taken for an orphan and skipped."""
    index = ChunkIndex(max_bytes=20)
    index.add(k(50), 10)
    index.add(k(51), 10)
    index.expect([(k(1), None), (k(2), k(1))])  # job A
    index.expect([(k(1), None), (k(2), k(1))])  # job B, the same chunks
    index.forget([k(1), k(2)])  # job A ended (nothing written: B writes them)
    assert index.reserve(10, k(2), k(3)) == [k(50)]  # B's child: its parent still counts
    index.forget([k(1), k(2)])  # job B ended too
    assert index.reserve(10, k(2), k(4)) is None  # now an orphan


def test_a_write_outlives_the_end_of_another_job_announcing_the_same_key() -> None:
    index = ChunkIndex(max_bytes=30)
    index.expect([(k(1), None)])  # job A announces k(1)
    assert index.reserve(10, None, k(1)) == []  # job B writes k(1)
    index.forget([k(1)])  # job A ends
    assert index.merge_cold([(k(1), 10, None)]) == []  # a listing sees B's put in flight
    assert index.used_bytes == 10  # the reservation alone, not it and an entry
    index.commit(k(1), 10)
    assert index.used_bytes == 10 and len(index) == 1


# -- max_chunks: an index without max_bytes forgets its coldest entries ----------------------
def test_past_max_chunks_the_coldest_entries_are_forgotten_and_nothing_is_deleted() -> None:
    index = ChunkIndex(None, max_chunks=3)
    chain(index, [1, 2, 3])
    assert index.add(k(4), 10) == []  # a victim returned would be deleted: none is
    assert len(index) == 3 and index.forgotten_count() == 1
    assert k(3) not in index  # the chain's tail was coldest
    assert all(k(i) in index for i in (1, 2, 4))


def test_exactly_max_chunks_are_remembered() -> None:
    index = ChunkIndex(None, max_chunks=3)
    chain(index, [1, 2, 3])
    assert len(index) == 3 and index.forgotten_count() == 0
    index.commit(k(5), 10)  # a write landing counts too
    assert len(index) == 3 and index.forgotten_count() == 1


def test_unreachable_entries_are_forgotten_first() -> None:
    index = ChunkIndex(None, max_chunks=3)
    index.add(k(2), 10, k(1))  # its parent was never held: unreachable
    index.add(k(7), 10)
    index.add(k(8), 10)
    index.add(k(9), 10)
    assert k(2) not in index and all(k(i) in index for i in (7, 8, 9))
    assert index.unreachable_count() == 0


def test_a_listing_merged_past_max_chunks_keeps_the_most_recent() -> None:
    index = ChunkIndex(None, max_chunks=2)
    index.add(k(9), 10)  # used since the listing: more recent than anything listed
    assert index.merge_cold([(k(1), 10, None), (k(2), 10, None), (k(3), 10, None)]) == []
    assert k(9) in index and k(3) in index and len(index) == 2


def test_max_bytes_overrides_max_chunks_every_entry_counts_against_the_bound() -> None:
    index = ChunkIndex(1000, max_chunks=2)
    chain(index, [1, 2, 3, 4])
    assert len(index) == 4 and index.forgotten_count() == 0
    assert index.used_bytes == 40


@pytest.mark.parametrize("bad", [0, -1])
def test_max_chunks_below_one_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="max_chunks"):
        ChunkIndex(None, max_chunks=bad)


# -- a look at the store beside evictions --------------------------------------------------------
@pytest.mark.parametrize("dropped_by", ["eviction", "discard"])
def test_a_listing_does_not_bring_back_a_chunk_dropped_while_it_ran(dropped_by: str) -> None:
    """The listing saw chunk 1 before it was evicted (or found gone): merged, it would be
    evicted and deleted a second time, or announced as held while its file is gone."""
    index = ChunkIndex(max_bytes=10 if dropped_by == "eviction" else None)
    mark = index.mark()
    index.add(k(1), 10)
    if dropped_by == "eviction":
        assert index.add(k(2), 10) == [k(1)]
    else:
        assert index.discard(k(1))
    assert index.merge_cold([(k(1), 10, None)], since=mark) == []
    assert k(1) not in index
    index.deleted(k(1))  # the caller deleted what was evicted
    later = index.merge_cold([(k(1), 10, None)], since=index.mark())  # a listing after that
    assert later == ([k(1)] if dropped_by == "eviction" else [])


def test_a_probe_that_raced_a_delete_indexes_nothing_and_evicts_nothing() -> None:
    """A probe's stat saw chunk 1, whose eviction came before its answer: indexing it would
    evict the live chunk 2 for a file that is gone. One that began after the drop (chunk 1
    written again, by another instance) indexes it."""
    index = ChunkIndex(max_bytes=10)
    index.add(k(1), 10)
    mark = index.mark()
    assert index.add(k(2), 10) == [k(1)]
    assert index.add(k(1), 10, since=mark) is None
    assert k(2) in index and k(1) not in index
    index.deleted(k(1))
    assert index.add(k(1), 10, since=index.mark()) == [k(2)]


def test_a_probe_begun_after_an_eviction_but_before_its_delete_ended_indexes_nothing() -> None:
    """Evicted first, then the probe's mark and look (the file still there), then the unlink:
    the key is skipped while its delete is on its way, and after it ends for every look that
    began before that."""
    index = ChunkIndex(max_bytes=10)
    index.add(k(1), 10)
    assert index.add(k(2), 10) == [k(1)]  # evicted: its delete is on its way
    before_the_unlink = index.mark()
    assert index.add(k(1), 10, since=before_the_unlink) is None
    index.deleted(k(1))
    assert index.add(k(1), 10, since=before_the_unlink) is None
    assert k(2) in index and k(1) not in index


def test_without_a_mark_a_merge_indexes_what_it_found() -> None:
    """Without ``since`` (``kvtier cache gc``) nothing dropped is skipped."""
    index = ChunkIndex(max_bytes=None)
    index.add(k(1), 10)
    index.discard(k(1))
    index.merge_cold([(k(1), 10, None)])
    assert k(1) in index


def test_only_the_last_dropped_keys_are_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory of drops is bounded: past the limit the first dropped are forgotten."""
    monkeypatch.setattr(drops, "MAX_DROPPED_REMEMBERED", 3)
    index = ChunkIndex(max_bytes=None)
    mark = index.mark()
    for i in range(1, 5):
        index.add(k(i), 10)
        index.discard(k(i))
    index.merge_cold([(k(i), 10, None) for i in range(1, 5)], since=mark)
    assert [i for i in range(1, 5) if k(i) in index] == [1]


def test_a_chunk_dropped_and_stored_again_stays_indexed_whatever_a_probe_raced() -> None:
    """Dropped after the mark, then written again: the probe's answer finds it indexed."""
    index = ChunkIndex(max_bytes=None)
    index.add(k(1), 10)
    mark = index.mark()
    index.discard(k(1))
    index.add(k(1), 10)  # stored again
    assert index.add(k(1), 10, since=mark) == []
    assert k(1) in index
