"""``kvtier.bench.verdict`` on synthetic per-round ratios whose answers are known."""

from __future__ import annotations

import math
import random

import pytest

from kvtier.bench.verdict import (
    AHEAD,
    BEHIND,
    MIXED,
    NO_DIFFERENCE,
    Interval,
    interval,
    median_rank,
    metric_verdict,
    overall,
)


def test_a_constant_series_has_a_point_interval_at_its_value():
    found = interval([1.25] * 6)
    assert (found.median, found.low, found.high, found.rounds) == (1.25, 1.25, 1.25, 6)


def test_the_interval_is_made_of_order_statistics_around_the_median():
    ratios = [1.3, 0.9, 1.2, 1.0, 1.1, 0.8, 1.4, 1.05, 0.95]  # 9 rounds: [x(2), x(8)]
    found = interval(ratios)
    assert (found.median, found.low, found.high) == (1.05, 0.9, 1.3)


@pytest.mark.parametrize(
    ("rounds", "rank"), [(5, 0), (6, 1), (8, 1), (9, 2), (12, 3), (17, 5), (20, 6), (100, 40)]
)
def test_the_rank_is_the_binomial_tables(rounds, rank):
    """The textbook ranks of a 95 % interval for the median (sign-test tables)."""
    assert median_rank(rounds) == rank


@pytest.mark.parametrize("rounds", [6, 8, 12, 20])
def test_between_equal_strategies_a_metric_finds_a_difference_at_most_5_percent_of_runs(rounds):
    """The bootstrap before found one in half the runs of 2 rounds and 13 % of 4; 20,000
    simulated runs of log-normal noise (seeded) per K."""
    rng = random.Random(rounds)
    runs = 20_000
    found = sum(
        metric_verdict(interval([rng.lognormvariate(0, 0.2) for _ in range(rounds)]), True)
        != NO_DIFFERENCE
        for _ in range(runs)
    )
    assert found / runs <= 0.05


def test_more_rounds_give_a_narrower_interval():
    noisy = [1.0, 1.4, 0.8, 1.2, 1.1, 0.9, 1.3, 1.05]
    wide, narrow = interval(noisy), interval(noisy * 4)
    assert narrow.high - narrow.low < wide.high - wide.low


@pytest.mark.parametrize(
    ("ratios", "said"), [([1.4], "1 round"), ([1.3, 1.4, 1.5] * 1, "3 rounds")]
)
def test_fewer_than_six_rounds_give_a_median_and_no_interval_and_say_so(ratios, said):
    found = interval(ratios)
    assert (found.median, found.low, found.high) == (1.4, None, None)
    assert found.describe() == f"1.400x ({said}: no interval)"
    assert metric_verdict(found, higher_is_better=True) == NO_DIFFERENCE
    assert found.to_json() == {"median": 1.4, "low": None, "high": None, "rounds": len(ratios)}


def test_five_rounds_all_far_ahead_still_show_no_difference():
    """Their range covers the median with 94 % only: no verdict from it."""
    assert metric_verdict(interval([1.30, 1.35, 1.28, 1.41, 1.33]), True) == NO_DIFFERENCE


def test_an_interval_that_misses_one_never_prints_as_touching_it():
    found = interval([1.003, 1.2, 1.25, 1.3, 1.22, 1.1])
    assert found.describe() == "1.210x [1.003, 1.300]"
    assert metric_verdict(found, True) == AHEAD


@pytest.mark.parametrize("bad", [[], [1.0, math.nan] * 3, [1.0, math.inf] * 3])
def test_no_rounds_or_a_ratio_that_is_not_finite_is_an_error(bad):
    with pytest.raises(ValueError):
        interval(bad)


def test_a_clearly_ahead_series():
    throughput = interval([1.30, 1.35, 1.28, 1.41, 1.33, 1.37])
    ttft = interval([0.70, 0.75, 0.68, 0.80, 0.72, 0.71])
    assert throughput.low > 1.0 and ttft.high < 1.0
    verdicts = [metric_verdict(throughput, True), metric_verdict(ttft, False)]
    assert verdicts == [AHEAD, AHEAD] and overall(verdicts) == AHEAD


def test_a_clearly_behind_series():
    throughput = interval([0.70, 0.66, 0.74, 0.71, 0.69, 0.72])
    ttft = interval([1.5, 1.4, 1.6, 1.45, 1.55, 1.42])
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
    assert metric_verdict(interval([1.0] * 6), True) == NO_DIFFERENCE


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
