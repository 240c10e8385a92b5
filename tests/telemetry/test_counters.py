"""Counters bound once for hot paths count into the same series as ``count``."""

from __future__ import annotations

from kvtier.telemetry.metrics import ManagerMetrics, labels_key


def test_a_bound_counter_adds_to_the_series_count_adds_to() -> None:
    metrics = ManagerMetrics()
    hits = metrics.counter("tier_lookups", tier="fs", result="hit")
    hits(1)
    hits(2)
    metrics.count("tier_lookups", result="hit", tier="fs")  # label order does not matter
    metrics.count("tier_lookups", tier="fs", result="miss")
    get = metrics.telemetry.get
    assert get("kvtier_tier_lookups_total", tier="fs", result="hit") == 4
    assert get("kvtier_tier_lookups_total", tier="fs", result="miss") == 1
    assert get("kvtier_tier_lookups_total", tier="s3", result="hit") == 0


def test_labels_key_is_the_labels_sorted_by_name() -> None:
    assert labels_key({"tier": "fs", "result": "hit"}) == (("result", "hit"), ("tier", "fs"))
    assert labels_key({}) == ()
