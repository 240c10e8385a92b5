"""Is one strategy ahead of another over K rounds? An interval for the median, and a verdict.

Engine-neutral: the inputs are per-round ratios ``mine / other`` measured at one size (one
ratio per round, each from the two strategies' measurements in that same round, so a round's
load affects both sides of its ratio). ``interval`` gives their median and a distribution-free
confidence interval of the median from the order statistics: sorted, the ratios ``x(1) <= ...
<= x(K)`` give ``[x(j), x(K+1-j)]``, with ``j`` the largest rank for which the number of rounds
below the true median falls short of ``j`` with probability at most ``(1 - level) / 2``
(binomial, K trials of 1/2). Its coverage is at least ``level`` (95 % by default) whatever the
ratios' distribution, for any K; a percentile bootstrap, used before, covered the median only
half the time with 2 rounds (its interval was their range). Fewer than 6 rounds give no 95 %
interval, and say so: even their whole range covers the median with probability
``1 - 2 ** (1 - K)`` only (94 % with 5 rounds).

``metric_verdict`` reads one interval, strictly: a metric where higher is better (throughput)
is ``AHEAD`` when the whole interval lies above 1.0 (``low > 1``), ``BEHIND`` when it lies
below (``high < 1``); a metric where lower is better (TTFT) the other way round. An interval
that contains or touches 1.0, or no interval, is ``NO_DIFFERENCE``. ``overall`` combines the
metrics: ``AHEAD`` when at least one metric is ahead and none is behind, ``BEHIND`` the
converse, ``MIXED`` when one is ahead and another behind, else ``NO_DIFFERENCE``; reading two
intervals, it finds a difference between equal strategies up to twice as often as one does.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

AHEAD, BEHIND, NO_DIFFERENCE, MIXED = "ahead", "behind", "no difference shown", "mixed"
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """The median of the per-round ratios and its interval (``None``: too few rounds)."""

    median: float
    low: float | None
    high: float | None
    rounds: int

    def to_json(self) -> dict[str, float | int | None]:
        """The interval rounded to 4 places, for a report."""
        return {
            "median": round(self.median, 4),
            "low": None if self.low is None else round(self.low, 4),
            "high": None if self.high is None else round(self.high, 4),
            "rounds": self.rounds,
        }

    def describe(self) -> str:
        """``1.124x [1.031, 1.203]`` (to the 3 places a ratio is kept to, so that an interval
        that misses 1.0 never prints as touching it), or ``1.124x (3 rounds: no interval)``."""
        if self.low is None or self.high is None:
            rounds = f"{self.rounds} round{'s' if self.rounds != 1 else ''}"
            return f"{self.median:.3f}x ({rounds}: no interval)"
        return f"{self.median:.3f}x [{self.low:.3f}, {self.high:.3f}]"


def interval(ratios: Sequence[float], level: float = LEVEL) -> Interval:
    """The median of ``ratios`` (one per round, finite) and its order-statistic interval."""
    values = sorted(float(r) for r in ratios)
    if not values:
        raise ValueError("no rounds to summarize")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"ratios must be finite numbers, got {values}")
    median = statistics.median(values)
    rank = median_rank(len(values), level)
    if rank == 0:
        return Interval(median, None, None, len(values))
    return Interval(median, values[rank - 1], values[len(values) - rank], len(values))


def median_rank(rounds: int, level: float = LEVEL) -> int:
    """The largest ``j`` (1-based) for which ``[x(j), x(rounds + 1 - j)]`` covers the median
    with probability ``>= level``; 0 when even the whole range falls short."""
    tail, below, rank = (1 - level) / 2, 0.0, 0
    for j in range(1, rounds // 2 + 1):
        below += math.comb(rounds, j - 1) / 2**rounds  # P(fewer than j rounds below)
        if below > tail:
            break
        rank = j
    return rank


def metric_verdict(found: Interval, higher_is_better: bool) -> str:
    """``AHEAD``, ``BEHIND`` or ``NO_DIFFERENCE`` for one metric (see the module docstring)."""
    if found.low is None or found.high is None:
        return NO_DIFFERENCE
    above, below = found.low > 1.0, found.high < 1.0
    if not (above or below):
        return NO_DIFFERENCE
    return AHEAD if above == higher_is_better else BEHIND


def overall(verdicts: Sequence[str]) -> str:
    """The metrics' verdicts combined (see the module docstring)."""
    ahead, behind = AHEAD in verdicts, BEHIND in verdicts
    if ahead and behind:
        return MIXED
    return AHEAD if ahead else BEHIND if behind else NO_DIFFERENCE
