"""SLOGuard: switch a secondary tier off while it breaks a latency budget, and back on later.

Budgets are p99 latencies over a sliding window of ``window_s`` seconds:

* ``promotion_p99_s``: a tier's promotion (load job) latency, per tier; a promotion that failed
  counts as over the budget (its chunks are recomputed: a tier that fails is worse than slow);
* ``ttft_p99_s`` / ``itl_p99_s``: time to first token and inter-token latency, as the engine
  reports them (``TieringManager.report_request``).

A budget counts as broken once at least ``min_samples`` samples are in the window and their p99
is over it. Broken for ``sustain_s`` seconds in a row, the guard trips: a promotion budget
disables the tier that breaks it, a request budget the newest enabled tier (the last one in the
config). A disabled tier comes back after its cool-down; a request budget must also have
recovered below ``recover_ratio`` of itself (hysteresis). Each trip of the same tier within
``window_s`` of its return doubles its next cool-down (up to 16 times ``cooldown_s``), so a tier
that stays slow is tried less and less often and the guard never flaps. After any trip (by any
budget: a slow tier often breaks several at once), only request samples taken since count
towards a request budget's next trip (the older ones blamed the tier already switched off),
while a recovery is judged on the whole window. A tier back from its cool-down is judged on the
promotions it serves from then on (jobs in flight at its trip report theirs late). A tier
switched by hand (``switched_by_hand``) is the operator's: the guard does not switch it back on.

Thread safety: none; the manager calls it under its lock. ``clock`` is injectable for tests.
"""

from __future__ import annotations

import math
import numbers
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated

from kvtier.config.checks import Bounds, Timeout, check_fields
from kvtier.errors import ConfigError, InvalidArgumentError

MAX_SAMPLES = 4096  # per series: the p99 of a window never sorts more than this
MAX_BACKOFF = 16


Ratio = Annotated[float, Bounds(0, 1, "a number in (0, 1]", integer=False, open_low=True)]
Samples = Annotated[int, Bounds(1, MAX_SAMPLES, f"an integer from 1 to {MAX_SAMPLES}")]


def latency(name: str, value: object) -> float | None:
    """``value`` as a latency in seconds (``None`` stays ``None``); ``InvalidArgumentError``
    naming ``name`` for anything but a finite number >= 0 (a bool, a string, NaN, inf...)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{name}: expected seconds (a number >= 0), got {value!r}")
    seconds = float(value)
    if not (math.isfinite(seconds) and seconds >= 0):
        raise InvalidArgumentError(f"{name}: expected a finite number >= 0, got {value}")
    return seconds


@dataclass(frozen=True)
class SLOGuardConfig:
    """``slo_guard``: latency budgets (seconds, p99) and how the guard reacts to them.

    Every duration is above 0 and at most a day; ``ConfigError`` names a bad key.
    """

    promotion_p99_s: Timeout | None = None
    ttft_p99_s: Timeout | None = None
    itl_p99_s: Timeout | None = None
    window_s: Timeout = 60.0
    sustain_s: Timeout = 30.0
    cooldown_s: Timeout = 120.0
    min_samples: Samples = 20
    recover_ratio: Ratio = 0.8

    def __post_init__(self) -> None:
        check_fields(self)
        budgets = ("promotion_p99_s", "ttft_p99_s", "itl_p99_s")
        if all(getattr(self, name) is None for name in budgets):
            raise ConfigError(f"{', '.join(budgets)}: give at least one budget")


@dataclass(frozen=True)
class Decision:
    """Switch ``tier`` off (``enable=False``) or back on, because of ``reason``."""

    tier: str
    enable: bool
    reason: str


class Window:
    """Samples of one latency series in the last ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._samples: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)

    def add(self, now: float, value: float) -> None:
        self._samples.append((now, value))

    def p99(self, now: float, min_samples: int, after: float | None = None) -> float | None:
        """The p99 of the window's samples (only those taken after ``after``, if given), or
        ``None`` with fewer than ``min_samples`` of them."""
        while self._samples and self._samples[0][0] < now - self.seconds:
            self._samples.popleft()
        values = sorted(v for t, v in self._samples if after is None or t > after)
        if len(values) < min_samples:
            return None
        return values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)]


@dataclass
class _Trip:
    """A disabled tier: when it may return, and what must hold for it to."""

    reason: str
    until: float
    backoff: int = 1
    returned_at: float | None = None


@dataclass
class SLOGuard:
    """Watches the budgets of ``config`` and says which tiers to switch (``decide``)."""

    config: SLOGuardConfig
    clock: Callable[[], float] = time.monotonic
    _promotions: dict[str, Window] = field(default_factory=dict)
    _requests: dict[str, Window] = field(default_factory=dict)
    _broken_since: dict[str, float] = field(default_factory=dict)
    _trips: dict[str, _Trip] = field(default_factory=dict)
    _tripped_at: dict[str, float] = field(default_factory=dict)  # "ttft", "itl" -> the last trip

    # -- samples -----------------------------------------------------------------------------
    def observe_promotion(self, tier: str, seconds: float, failed: bool = False) -> None:
        """A promotion from ``tier`` took ``seconds``. One that ``failed`` (a chunk it did not
        deliver is recomputed) counts as over the budget: twice it, or its time if longer."""
        budget = self.config.promotion_p99_s
        if budget is not None and math.isfinite(seconds):
            sample = max(seconds, 2 * budget) if failed else seconds
            self._window(self._promotions, tier).add(self.clock(), sample)

    def observe_request(self, ttft_s: float | None = None, itl_s: float | None = None) -> None:
        """Latencies of one finished request, as the engine measured them (either may be None;
        each checked by ``latency``)."""
        for name, value in (("ttft", ttft_s), ("itl", itl_s)):
            seconds = latency(f"{name}_s", value)
            if seconds is not None:
                self._window(self._requests, name).add(self.clock(), seconds)

    def _window(self, windows: dict[str, Window], name: str) -> Window:
        return windows.setdefault(name, Window(self.config.window_s))

    # -- decisions ---------------------------------------------------------------------------
    def decide(self, enabled: Sequence[str], disabled: Sequence[str]) -> list[Decision]:
        """Tiers to switch now; ``enabled``/``disabled`` name the tiers in config order."""
        now = self.clock()
        decisions = self._returns(now, disabled)
        for budget, tier in self._sustained_breaches(now, enabled):
            if tier not in (d.tier for d in decisions):
                decisions.append(self._trip(now, tier, budget))
        return decisions

    def _sustained_breaches(self, now: float, enabled: Sequence[str]) -> list[tuple[str, str]]:
        """(budget, tier to disable) for each budget broken for ``sustain_s``."""
        found = []
        for budget, tier in self._breaches(now, enabled):
            since = self._broken_since.setdefault(budget, now)
            if now - since >= self.config.sustain_s:
                found.append((budget, tier))
                del self._broken_since[budget]
        return found

    def _breaches(self, now: float, enabled: Sequence[str]) -> list[tuple[str, str]]:
        broken: list[tuple[str, str]] = []
        for tier in enabled:
            if self._over(self._promotions.get(tier), self.config.promotion_p99_s, now):
                broken.append((f"promotion_p99:{tier}", tier))
        for name in ("ttft", "itl"):  # judged on the samples since its last trip only
            window, since = self._requests.get(name), self._tripped_at.get(name)
            if enabled and self._over(window, self._budget(name), now, since):
                broken.append((f"{name}_p99", enabled[-1]))
        seen = {budget for budget, _ in broken}
        for budget in [b for b in self._broken_since if b not in seen]:
            del self._broken_since[budget]
        return broken

    def _over(
        self, window: Window | None, budget: float | None, now: float, after: float | None = None
    ) -> bool:
        if window is None or budget is None:
            return False
        p99 = window.p99(now, self.config.min_samples, after)
        return p99 is not None and p99 > budget

    def _budget(self, name: str) -> float | None:
        return self.config.ttft_p99_s if name == "ttft" else self.config.itl_p99_s

    def _trip(self, now: float, tier: str, budget: str) -> Decision:
        previous = self._trips.get(tier)
        backoff = 1
        if previous and previous.returned_at and now - previous.returned_at < self.config.window_s:
            backoff = min(previous.backoff * 2, MAX_BACKOFF)
        reason = budget.split(":")[0]
        until = now + self.config.cooldown_s * backoff
        self._trips[tier] = _Trip(reason, until, backoff)
        self._promotions.pop(tier, None)
        for name in ("ttft", "itl"):  # samples so far were taken with this tier on: whichever
            self._tripped_at[name] = now  # budget tripped it, they cannot blame another tier
        return Decision(tier, enable=False, reason=reason)

    def switched_by_hand(self, tier: str) -> None:
        """An operator switched ``tier`` (on or off): a cool-down pending for it is over, so
        the guard never switches it back on behind the operator; a new trip soon after still
        lengthens the next cool-down."""
        trip = self._trips.get(tier)
        if trip is not None and trip.returned_at is None:
            trip.returned_at = self.clock()

    def _returns(self, now: float, disabled: Sequence[str]) -> list[Decision]:
        decisions = []
        for tier in disabled:
            trip = self._trips.get(tier)
            if trip is None or trip.returned_at is not None or now < trip.until:
                continue
            if trip.reason in ("ttft_p99", "itl_p99") and not self._recovered(now, trip.reason):
                continue
            trip.returned_at = now
            self._promotions.pop(tier, None)  # late reports of jobs in flight at the trip
            decisions.append(Decision(tier, enable=True, reason="cooled_down"))
        return decisions

    def _recovered(self, now: float, reason: str) -> bool:
        name = reason.removesuffix("_p99")
        budget = self._budget(name)
        window = self._requests.get(name)
        p99 = None if window is None else window.p99(now, 1)
        return budget is None or p99 is None or p99 < budget * self.config.recover_ratio
