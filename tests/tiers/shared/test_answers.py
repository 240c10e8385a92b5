"""Answers: remembered hits and misses, expiry, holders, probes in flight."""

from __future__ import annotations

import time

from kvtier.keys import ChunkKey
from kvtier.tiers.base import HIT, MISS, RETRY
from kvtier.tiers.shared.answers import Answers
from kvtier.tiers.shared.probes_in_flight import MAX_PROBING, ProbesInFlight

A, B, C = (ChunkKey(bytes([i]) * 32) for i in range(3))


def test_unknown_key_is_probed_once_then_answered():
    answers = Answers(miss_ttl_s=60)
    assert answers.answer(A) is None
    assert answers.answer(A) is RETRY
    answers.found(A)
    assert answers.answer(A) is HIT and answers.is_hit(A)
    answers.missing(B)
    assert answers.answer(B) is MISS and not answers.is_hit(B)


def test_a_probes_answer_stands_only_while_nothing_newer_is_known():
    """A store (``found``) or an eviction (``missing``) during a probe is newer than the probe's
    answer, which is then dropped; with nothing meanwhile, the answer is recorded."""
    answers = Answers(miss_ttl_s=60)
    for key, meanwhile, probe_found, expected in (
        (A, "found", False, HIT),  # a put during a HEAD that found nothing: the put stands
        (B, "missing", True, MISS),  # an eviction during a HEAD that found the object
        (C, None, True, HIT),
    ):
        assert answers.answer(key) is None  # now under probe
        if meanwhile is not None:
            getattr(answers, meanwhile)(key)
        assert answers.probed(key, found=probe_found) is (meanwhile is None)
        assert answers.answer(key) is expected
    assert answers.sizes()["probes_in_flight"] == 0
    assert answers.probed(A, found=False) is False  # no probe of A under way: nothing changes
    assert answers.answer(A) is HIT


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
    assert answers.sizes() == {
        "remembered_hits": 0,
        "remembered_misses": 0,
        "probes_in_flight": 0,
        "probes_skipped_backlog": 0,
    }


def test_at_most_limit_keys_are_probed_at_once_the_next_is_a_counted_miss():
    a, b, c = (ChunkKey(bytes([i]) * 32) for i in range(3))
    probing = ProbesInFlight(limit=2)
    assert probing.claim(a) is None and probing.claim(b) is None  # exactly the limit
    assert probing.claim(c) is MISS and probing.skipped == 1  # one past it
    assert probing.claim(a) is RETRY and probing.skipped == 1  # already under probe
    probing.done(a)
    assert probing.claim(c) is None and len(probing) == 2


def test_answers_past_max_probing_answer_miss_and_say_how_many():
    answers = Answers(60.0)
    keys = [ChunkKey(i.to_bytes(32, "big")) for i in range(MAX_PROBING + 1)]
    assert all(answers.answer(key) is None for key in keys[:MAX_PROBING])
    assert answers.answer(keys[-1]) is MISS
    answers.missing(keys[0])
    assert answers.answer(keys[-1]) is None  # room again
    assert answers.sizes()["probes_skipped_backlog"] == 1
