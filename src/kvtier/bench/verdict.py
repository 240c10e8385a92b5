"""Is one strategy ahead of another over K rounds? A bootstrap interval and a verdict.

Engine-neutral: the inputs are per-round ratios ``mine / other`` measured at one size (one
ratio per round, each from the two strategies' measurements in that same round, so a round's
load affects both sides of its ratio). ``interval`` gives their median and a percentile
bootstrap interval of that median: the rounds are resampled with replacement ``RESAMPLES``
times with the fixed seed ``SEED``, the median taken of each resample, and the interval is the
``(1 - level) / 2`` and ``(1 + level) / 2`` percentiles of those medians (95 % by default).
One round gives a median and no interval.

``metric_verdict`` reads one interval, strictly: a metric where higher is better (throughput)
is ``AHEAD`` when the whole interval lies above 1.0 (``low > 1``), ``BEHIND`` when it lies
below (``high < 1``); a metric where lower is better (TTFT) the other way round. An interval
that contains or touches 1.0, or no interval, is ``NO_DIFFERENCE``. ``overall`` combines the
metrics: ``AHEAD`` when at least one metric is ahead and none is behind, ``BEHIND`` the
converse, ``MIXED`` when one is ahead and another behind, else ``NO_DIFFERENCE``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

AHEAD, BEHIND, NO_DIFFERENCE, MIXED = "ahead", "behind", "no difference shown", "mixed"
RESAMPLES = 2000
SEED = 0
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """The median of the per-round ratios and its bootstrap interval (``None`` for 1 round)."""

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
        """``1.12x [1.03, 1.20]``, or ``1.12x (1 round: no interval)``."""
        if self.low is None or self.high is None:
            return f"{self.median:.2f}x ({self.rounds} round: no interval)"
        return f"{self.median:.2f}x [{self.low:.2f}, {self.high:.2f}]"


def interval(
    ratios: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL
) -> Interval:
    """The median of ``ratios`` (one per round) and its percentile bootstrap interval."""
    values = np.asarray(ratios, dtype=float)
    if values.size == 0:
        raise ValueError("no rounds to summarize")
    median = float(np.median(values))
    if values.size == 1:
        return Interval(median, None, None, 1)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, values.size, size=(resamples, values.size))
    medians = np.median(values[picks], axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return Interval(median, float(low), float(high), int(values.size))


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
