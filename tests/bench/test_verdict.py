"""``kvtier.bench.verdict`` on synthetic per-round ratios whose answers are known."""

from __future__ import annotations

import pytest

from kvtier.bench.verdict import (
    AHEAD,
    BEHIND,
    MIXED,
    NO_DIFFERENCE,
    Interval,
    interval,
    metric_verdict,
    overall,
)


def test_a_constant_series_has_a_point_interval_at_its_value():
    found = interval([1.25] * 6)
    assert (found.median, found.low, found.high, found.rounds) == (1.25, 1.25, 1.25, 6)


def test_the_interval_holds_the_median_and_lies_within_the_rounds():
    ratios = [0.9, 1.0, 1.1, 1.2, 1.3]
    found = interval(ratios)
    assert found.median == 1.1
    assert min(ratios) <= found.low <= found.median <= found.high <= max(ratios)


def test_the_same_seed_gives_the_same_interval_and_more_rounds_a_narrower_one():
    noisy = [1.0, 1.4, 0.8, 1.2, 1.1, 0.9, 1.3, 1.05]
    assert interval(noisy) == interval(noisy)
    wide, narrow = interval(noisy[:3]), interval(noisy * 4)
    assert narrow.high - narrow.low < wide.high - wide.low


def test_one_round_gives_a_median_and_no_interval_and_says_so():
    found = interval([1.4])
    assert (found.median, found.low, found.high) == (1.4, None, None)
    assert found.describe() == "1.40x (1 round: no interval)"
    assert metric_verdict(found, higher_is_better=True) == NO_DIFFERENCE
    assert found.to_json() == {"median": 1.4, "low": None, "high": None, "rounds": 1}


def test_no_rounds_is_an_error():
    with pytest.raises(ValueError):
        interval([])


def test_a_clearly_ahead_series():
    throughput = interval([1.30, 1.35, 1.28, 1.41, 1.33])
    ttft = interval([0.70, 0.75, 0.68, 0.80, 0.72])
    assert throughput.low > 1.0 and ttft.high < 1.0
    verdicts = [metric_verdict(throughput, True), metric_verdict(ttft, False)]
    assert verdicts == [AHEAD, AHEAD] and overall(verdicts) == AHEAD


def test_a_clearly_behind_series():
    throughput = interval([0.70, 0.66, 0.74, 0.71])
    ttft = interval([1.5, 1.4, 1.6, 1.45])
    verdicts = [metric_verdict(throughput, True), metric_verdict(ttft, False)]
    assert verdicts == [BEHIND, BEHIND] and overall(verdicts) == BEHIND


def test_a_series_straddling_one_shows_no_difference():
    straddle = interval([0.8, 1.2, 0.9, 1.1, 1.0, 1.3, 0.7])
    assert straddle.low < 1.0 < straddle.high
    assert metric_verdict(straddle, True) == metric_verdict(straddle, False) == NO_DIFFERENCE


@pytest.mark.parametrize(
    ("low", "high", "higher", "expected"),
    [
        (1.0, 1.2, True, NO_DIFFERENCE),  # touches 1.0: not shown
        (1.0001, 1.2, True, AHEAD),
        (0.8, 1.0, True, NO_DIFFERENCE),
        (0.8, 0.9999, True, BEHIND),
        (0.8, 1.0, False, NO_DIFFERENCE),  # TTFT: lower is better
        (0.8, 0.9999, False, AHEAD),
        (1.0, 1.2, False, NO_DIFFERENCE),
        (1.0001, 1.2, False, BEHIND),
        (1.0, 1.0, True, NO_DIFFERENCE),
    ],
)
def test_both_sides_of_the_threshold(low, high, higher, expected):
    assert metric_verdict(Interval(1.0, low, high, 5), higher) == expected


def test_a_point_interval_exactly_at_one_shows_no_difference():
    assert metric_verdict(interval([1.0] * 5), True) == NO_DIFFERENCE


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ([AHEAD, NO_DIFFERENCE], AHEAD),
        ([NO_DIFFERENCE, BEHIND], BEHIND),
        ([AHEAD, BEHIND], MIXED),
        ([NO_DIFFERENCE, NO_DIFFERENCE], NO_DIFFERENCE),
    ],
)
def test_the_overall_verdict(verdicts, expected):
    assert overall(verdicts) == expected
