"""Answers: remembered hits and misses, expiry, holders, probes in flight."""

from __future__ import annotations

import time

from kvtier.keys import ChunkKey
from kvtier.tiers.base import HIT, MISS, RETRY
from kvtier.tiers.shared.answers import Answers

A, B, C = (ChunkKey(bytes([i]) * 32) for i in range(3))


def test_unknown_key_is_probed_once_then_answered():
    answers = Answers(miss_ttl_s=60)
    assert answers.answer(A) is None
    assert answers.answer(A) is RETRY
    answers.found(A)
    assert answers.answer(A) is HIT and answers.is_hit(A)
    answers.missing(B)
    assert answers.answer(B) is MISS and not answers.is_hit(B)


def test_answers_expire():
    answers = Answers(miss_ttl_s=0.05, hit_ttl_s=0.05)
    answers.found(A, holder="peer-1")
    answers.missing(B)
    assert answers.holder(A) == "peer-1"
    time.sleep(0.1)
    assert answers.holder(A) is None
    assert answers.answer(B) is MISS, "a miss no lookup was told is told once"
    assert answers.answer(A) is None and answers.answer(B) is None


def test_hits_are_bounded_least_recently_used_first():
    answers = Answers(miss_ttl_s=60, max_hits=2)
    answers.found(A)
    answers.found(B)
    assert answers.answer(A) is HIT  # A is now the most recent
    answers.found(C)
    assert answers.is_hit(A) and answers.is_hit(C) and not answers.is_hit(B)


def test_forget_holder_and_clear():
    answers = Answers(miss_ttl_s=60, hit_ttl_s=60)
    answers.found(A, "p1")
    answers.found(B, "p2")
    answers.forget_holder("p1")
    assert not answers.is_hit(A) and answers.is_hit(B)
    answers.missing(C)
    answers.clear()
    assert answers.sizes() == {"remembered_hits": 0, "remembered_misses": 0, "probes_in_flight": 0}
