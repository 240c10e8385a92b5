"""What a request may ask for, checked and capped in one place for every engine path: numbers of
any size (``checked_priority``, ``checked_duration``), the operator's caps (``RequestLimits``)
and the operator's own retention, which no request changes (``OperatorRetention``)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from kvtier.errors import shown
from kvtier.policies.priority import (
    DEFAULT_MAX_REQUEST_PRIORITY,
    DEFAULT_PRIORITY,
    OperatorRetention,
    RequestLimits,
    checked_duration,
    checked_priority,
)

HUGE = 10**400  # past the floats: float(HUGE) raises OverflowError
ENORMOUS = 10**5000  # past Python's int-to-text limit: repr(ENORMOUS) raises ValueError


@pytest.mark.parametrize(
    "value",
    [HUGE, -HUGE, ENORMOUS, -ENORMOUS, Fraction(HUGE), Fraction(1, HUGE), 1e-400, math.nan,
     math.inf, -math.inf, 0, -1, True, "5", None, [5]],
    ids=shown,
)  # fmt: skip
def test_a_duration_of_any_size_or_kind_is_a_value_error_with_a_short_message(value):
    with pytest.raises(ValueError, match="expected a finite number > 0") as caught:
        checked_duration(value)
    assert len(str(caught.value)) < 120


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(1, 1.0), (0.5, 0.5), (10**300, 1e300), (np.float32(2.5), 2.5), (np.int64(7), 7.0),
     (Fraction(3, 2), 1.5)],
    ids=shown,
)  # fmt: skip
def test_a_finite_positive_duration_is_its_float(value, seconds):
    assert checked_duration(value) == seconds


@pytest.mark.parametrize("value", [101, -1, HUGE, -ENORMOUS, 50.0, True, "80"], ids=shown)
def test_a_priority_out_of_range_is_a_value_error_with_a_short_message(value):
    with pytest.raises(ValueError, match="expected") as caught:
        checked_priority(value)
    assert len(str(caught.value)) < 120


@pytest.mark.parametrize("value", [0, 100, np.int64(35)])
def test_the_ends_of_the_priority_range_are_priorities(value):
    assert checked_priority(value) == int(value)


def test_shown_never_raises_and_stays_short():
    assert shown(ENORMOUS) == "an integer of more than 4300 digits"
    assert shown(HUGE).endswith("...") and len(shown(HUGE)) == 40
    assert shown(80) == "80"


# -- the operator's caps ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("asked", "given"),
    [(0, 0), (DEFAULT_PRIORITY, DEFAULT_PRIORITY), (79, 79), (80, 80), (81, 80), (100, 80)],
)
def test_a_priority_above_the_cap_is_cut_to_it(asked, given):
    assert RequestLimits(max_priority=80).clamp(asked, None) == (given, None)


@pytest.mark.parametrize(
    ("asked", "given"),
    [(None, 600.0), (599.5, 599.5), (600.0, 600.0), (600.001, 600.0), (1e300, 600.0)],
)
def test_a_duration_past_the_cap_or_for_good_is_cut_to_it(asked, given):
    limits = RequestLimits(max_priority=100, max_duration_s=600.0)
    assert limits.clamp(90, asked) == (90, given)
    assert limits.clamp(0, asked) == (0, given), "lowering a chunk for good is capped too"


def test_a_retention_at_the_default_priority_has_no_duration_to_cap():
    limits = RequestLimits(max_duration_s=600.0)
    assert limits.clamp(DEFAULT_PRIORITY, None) == (DEFAULT_PRIORITY, None)
    assert limits.clamp(DEFAULT_PRIORITY, 5000.0) == (DEFAULT_PRIORITY, 5000.0)


def test_by_default_requests_may_ask_up_to_90_for_as_long_as_they_like():
    assert DEFAULT_MAX_REQUEST_PRIORITY == 90
    assert RequestLimits().clamp(90, None) == (90, None)
    assert RequestLimits().clamp(91, 1e9) == (90, 1e9)


# -- the operator's retention -----------------------------------------------------------------
@pytest.mark.parametrize(("now", "holds"), [(9.999, True), (10.0, False), (11.0, False)])
def test_the_operators_retention_lasts_until_its_end_and_not_after(now, holds):
    given: OperatorRetention[str] = OperatorRetention()
    given.give("sys", 95, until=10.0)
    assert given.holds("sys", 95, now) is holds
    assert len(given) == (1 if holds else 0), "forgotten once over"


def test_the_operators_retention_ends_when_the_key_no_longer_has_its_priority():
    given: OperatorRetention[str] = OperatorRetention()
    given.give("sys", 95, until=None)
    assert given.holds("sys", None, 1e12), "a key still being written keeps it"
    assert given.holds("sys", 95, 1e12)
    assert not given.holds("sys", DEFAULT_PRIORITY, 0.0)  # evicted and stored anew, or expired
    assert not given.holds("sys", 95, 0.0)


def test_the_operators_retention_is_lifted_and_pruned():
    given: OperatorRetention[str] = OperatorRetention()
    for key in ("a", "b", "c"):
        given.give(key, 95, None)
    given.lift("a")
    given.prune(lambda key: key != "b")
    assert len(given) == 1 and given.holds("c", 95, 0.0) and not given.holds("a", 95, 0.0)
