"""Upkeep: the background thread of a bounded object tier.

It first rebuilds the index from a listing of the tier's namespace (``listing``), waiting while
the store is unavailable and resuming a listing that failed part way; lookups, loads and stores
go on meanwhile as without a bound (what they store is indexed at once, and the listing's older
objects go below it). Then, every ``interval_s``, it deletes the objects unused for longer than
``max_age_s`` and sends failed deletes again (``ObjectBound.expire``, ``retry``).

``stop()`` (from ``close``) ends it between two pages or sweeps and joins it; a page or a sweep
under way finishes first (each request bounded by ``timeout_s``).

Thread safety: ``start``/``stop`` from the tier's owner; the rest runs on the thread itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kvtier.errors import TierError
from kvtier.tiers.s3.bound import ObjectBound
from kvtier.tiers.s3.listing import NamespaceListing

log = logging.getLogger(__name__)

#: Longest time between two sweeps (expiry, delete retries); with ``max_age_s`` a quarter of it
#: when that is shorter.
SWEEP_MAX_S = 30.0
#: Wait between two attempts at a listing that failed, or while the store is unavailable.
RELIST_WAIT_S = 1.0


def sweep_interval(max_age_s: float | None) -> float:
    """Seconds between sweeps: a quarter of ``max_age_s``, at most ``SWEEP_MAX_S``."""
    return SWEEP_MAX_S if max_age_s is None else min(SWEEP_MAX_S, max_age_s / 4)


class Upkeep:
    """Rebuild, then sweep (see the module docstring).

    ``available()`` says whether requests may go out (the tier's circuit); ``count(name, n)``
    adds to the tier's counters: ``rebuild_failed``, and the listing's ``listing_pages``,
    ``listing_chunks`` and ``listing_ignored``.
    """

    def __init__(
        self,
        name: str,
        bound: ObjectBound,
        listing: NamespaceListing,
        available: Callable[[], bool],
        count: Callable[[str, int], None],
    ) -> None:
        self._bound, self._listing = bound, listing
        self._mark = bound.index.mark()  # before the tier's first put, which the listing may see
        self._available, self._count = available, count
        self._stop = threading.Event()
        self.rebuilt = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-upkeep", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end, and join it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        try:
            if self._rebuild():
                self._sweep_until_stopped()
        except Exception:  # the thread must never die silently
            log.exception("obj tier upkeep failed; the bound is no longer kept")

    def _rebuild(self) -> bool:
        """List the namespace until done (``True``) or stopped (``False``)."""
        while not self._stop.is_set():
            try:
                if not self._listing.run(self._stop, self._wait_available):
                    return False
            except TierError as exc:
                log.info("obj tier: listing its namespace failed (%s); trying again", exc)
                self._count("rebuild_failed", 1)
                self._stop.wait(RELIST_WAIT_S)
                continue
            self._report_listing()
            if not self._listing.merge_into(self._bound, self._stop, self._mark):
                return False
            self.rebuilt.set()
            return True
        return False

    def _wait_available(self) -> None:
        while not self._available() and not self._stop.wait(RELIST_WAIT_S):
            pass

    def _report_listing(self) -> None:
        for name, n in self._listing.counts.items():
            self._count(name, n)

    def _sweep_until_stopped(self) -> None:
        interval = sweep_interval(self._bound.max_age_s)
        while not self._stop.wait(interval):
            self._bound.expire()
            self._bound.retry()
