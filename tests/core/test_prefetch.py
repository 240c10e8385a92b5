"""``TieringManager.prefetch``: a prefix promoted ahead of its lookup, on a real fs tier.

A serving loop prefetches the next request's prefix while the current one runs. What must
hold: the chunks a lookup would promote land in host without any lookup; the prefix walk still
stops at its first hole; and nothing is counted as a lookup or a miss (the request's own lookup
counts them, once).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvtier import TieringManager
from tests.conftest import config, make_keys, push_out, read, store


@pytest.fixture
def fs_manager(identity, tmp_path) -> Iterator[TieringManager]:
    tiers = [{"type": "fs", "root_dir": str(tmp_path / "fs")}]
    with TieringManager(config(8, secondary_tiers=tiers), identity) as m:
        yield m


def ready(m: TieringManager, keys) -> list[bool]:
    return [m.host.is_ready(key) for key in keys]


def engine_counters(m: TieringManager) -> dict[str, float]:
    """What a lookup counts: calls, prompt tokens by source, recomputed chunks by reason."""
    names = ("kvtier_lookups_total", "kvtier_prompt_tokens_total", "kvtier_recomputed_chunks")
    return {k: v for k, v in m.stats()["counters"].items() if k.startswith(names)}


def test_a_prefetched_prefix_is_in_host_before_its_lookup(fs_manager, identity):
    m, keys = fs_manager, make_keys(identity, 4)
    store(m, keys)
    push_out(m, identity, 8)
    assert ready(m, keys) == [False] * 4
    before = engine_counters(m)
    m.prefetch(keys)
    assert m.wait_idle(20)
    m.poll()
    assert ready(m, keys) == [True] * 4
    assert engine_counters(m) == before  # neither a lookup nor a miss
    assert m.lookup(keys) == 4  # at once: no RETRY
    assert read(m, keys)
    assert engine_counters(m) != before


def test_prefetch_stops_at_the_first_chunk_held_nowhere(fs_manager, identity):
    m, keys = fs_manager, make_keys(identity, 4)
    store(m, keys[:2])
    store(m, keys[3:])
    push_out(m, identity, 8)
    m.prefetch(keys)
    assert m.wait_idle(20)
    m.poll()
    assert ready(m, keys) == [True, True, False, False]


def test_prefetch_of_keys_held_nowhere_reserves_and_counts_nothing(fs_manager, identity):
    m = fs_manager
    before = engine_counters(m)
    m.prefetch(make_keys(identity, 4, seed=77))
    assert m.stats()["host"]["used_slots"] == 0
    assert engine_counters(m) == before
    assert m.num_pending_jobs == 0


def test_prefetch_never_evicts_the_ready_part_of_its_prefix(fs_manager, identity):
    """Host holds 8 chunks: the prefix's 3 ready ones stay while 5 more are promoted."""
    m, keys = fs_manager, make_keys(identity, 8)
    store(m, keys)
    push_out(m, identity, 5)  # keys[:5] leave host; keys[5:] stay
    assert ready(m, keys) == [False] * 5 + [True] * 3
    m.prefetch(keys)
    assert m.wait_idle(20)
    m.poll()
    assert ready(m, keys) == [True] * 8
    assert m.lookup(keys) == 8 and read(m, keys)
