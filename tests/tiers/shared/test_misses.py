"""RecentMisses: a miss lasts its ttl, and is told at least once whatever the ttl."""

from __future__ import annotations

import time

from kvtier.keys import ChunkKey
from kvtier.tiers.shared.misses import RecentMisses

A, B, C = (ChunkKey(bytes([i]) * 32) for i in range(3))


def test_a_miss_with_a_ttl_of_zero_is_told_once_then_forgotten():
    misses = RecentMisses(0.0)
    misses.add(A)
    assert A in misses, "the lookup that waited for the probe gets its answer"
    assert A not in misses, "the next one asks the medium again"
    assert len(misses) == 0


def test_a_miss_is_told_again_and_again_until_its_ttl_ends():
    misses = RecentMisses(0.1)
    misses.add(A)
    assert all(A in misses for _ in range(5))
    time.sleep(0.15)
    assert A not in misses


def test_an_expired_miss_no_lookup_was_told_is_told_once():
    misses = RecentMisses(0.01)
    misses.add(A)
    time.sleep(0.05)
    assert A in misses
    assert A not in misses


def test_misses_are_bounded_oldest_first_and_can_be_dropped():
    misses = RecentMisses(60.0, capacity=2)
    for key in (A, B, C):
        misses.add(key)
    assert A not in misses and B in misses and C in misses
    misses.discard(B)
    assert B not in misses
    misses.clear()
    assert C not in misses and len(misses) == 0
