"""TierControl: secondary tiers switched off and on at run time, by hand or by the SLO guard.

A switched-off tier is asked nothing and given no new job (``TierSet``); serving goes on from
host memory and the other tiers. Every switch is logged, counted
(``kvtier_tier_disabled_total{tier,reason}``), shown by the ``kvtier_tier_enabled{tier}`` gauge,
and kept as a ``TierSwitch`` record (``TieringManager.take_tier_switches``).

Thread safety: none; the manager calls it under its lock.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import NamedTuple

from kvtier.control.slo_guard import SLOGuard
from kvtier.core.tier_set import Finished, TierSet
from kvtier.errors import InvalidArgumentError

log = logging.getLogger(__name__)

MAX_SWITCHES = 1024
MAX_REASON = 64  # characters of a switch's reason (a label of kvtier_tier_disabled_total)


class TierSwitch(NamedTuple):
    """Tier ``tier`` was switched on (``enabled``) or off, because of ``reason``, at ``at``."""

    tier: str
    enabled: bool
    reason: str
    at: float


def check_switch(name: object, reason: object) -> None:
    """``InvalidArgumentError`` unless ``name`` is a string and ``reason`` a non-empty string
    of at most ``MAX_REASON`` printable characters: the reason becomes a metric label (one of
    another type would break every later scrape) and a log line (a newline in it, sent over
    the admin endpoint, would forge log lines)."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"name: expected a tier's name (a string), got {name!r}")
    if not is_reason(reason):
        raise InvalidArgumentError(
            f"reason: expected 1 to {MAX_REASON} printable characters, got {reason!r:.80}"
        )


def is_reason(reason: object) -> bool:
    """Whether ``reason`` is a switch's reason: 1 to ``MAX_REASON`` printable characters."""
    return isinstance(reason, str) and 0 < len(reason) <= MAX_REASON and reason.isprintable()


class TierControl:
    """Runtime on/off state of a manager's tiers, and the SLO guard that may drive it."""

    def __init__(self, tiers: TierSet, guard: SLOGuard | None = None) -> None:
        self._tiers, self.guard = tiers, guard
        self._switches: deque[TierSwitch] = deque(maxlen=MAX_SWITCHES)

    def switch(self, name: str, enable: bool, reason: str) -> bool:
        """Switch tier ``name``; whether its state changed (``KVTierError`` for no such tier)."""
        if not self._tiers.switch(name, enable, reason):
            return False
        level = logging.INFO if reason == "manual" else logging.WARNING
        log.log(level, "tier %s switched %s (%s)", name, "back on" if enable else "off", reason)
        self._switches.append(TierSwitch(name, enable, reason, time.time()))
        return True

    def switch_by_hand(self, name: str, enable: bool, reason: str) -> bool:
        """``switch`` for an operator: the guard then leaves the tier as the operator set it."""
        changed = self.switch(name, enable, reason)
        if self.guard is not None:
            self.guard.switched_by_hand(name)
        return changed

    def observe(self, finished: Finished) -> None:
        """A tier job reported: promotion latencies, and failed promotions, feed the guard. A
        promotion that went past its deadline was counted then (``step``): not again."""
        if self.guard is not None and finished.job.op == "load" and not finished.late:
            name = self._tiers[finished.job.tier].name
            self.guard.observe_promotion(name, finished.seconds, failed=bool(finished.failed))

    def report_request(self, ttft_s: float | None, itl_s: float | None) -> None:
        if self.guard is not None:
            self.guard.observe_request(ttft_s, itl_s)

    def step(self) -> None:
        """Promotions past their deadline feed the guard as failed (a hung tier breaks its
        budget as a slow one does; a late store is no promotion); then apply what the guard
        decides now (at every poll)."""
        late = self._tiers.check_deadlines()
        if self.guard is None:
            return
        now = time.monotonic()
        for job in late:
            if job.op == "load":
                name = self._tiers[job.tier].name
                self.guard.observe_promotion(name, now - job.started, failed=True)
        for decision in self.guard.decide(*self._tiers.split_by_state()):
            self.switch(decision.tier, decision.enable, decision.reason)

    def take_switches(self) -> list[TierSwitch]:
        switches = list(self._switches)
        self._switches.clear()
        return switches

    def enabled_gauge(self) -> dict[tuple[tuple[str, str], ...], float]:
        """``kvtier_tier_enabled``: 1 per enabled tier, 0 per disabled one."""
        enabled, disabled = self._tiers.split_by_state()
        return {(("tier", name),): float(name in enabled) for name in (*enabled, *disabled)}
