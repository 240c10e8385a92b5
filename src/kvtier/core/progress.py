"""Progress: wakes an engine thread waiting for the tiers after a lookup answered ``RETRY``.

Tiers that signal progress (``SecondaryTier.signals_progress``) call ``notify`` from their own
threads when a job finishes or a ``RETRY`` answer may have changed. The engine ``arm``s before
it looks at the tiers and ``wait``s after a ``RETRY``, so a signal that comes between the two is
never lost. A wait ends at the first signal; it lasts ``POLL_S`` at most while any tier does not
signal (that tier is polled, as before), and ``CAP_S`` at most in any case, so progress nobody
signals (a tier switched back on, a circuit closing) is still seen soon.

Why not sleep and poll: every poll takes the GIL from the tier thread reading the chunks, and
on a busy machine every wake-up of the engine may wait for a CPU; one wake-up at the end is the
least the engine can pay.

Thread safety: ``notify`` from any thread; ``arm`` and ``wait`` from the engine's.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from kvtier.tiers.base import SecondaryTier

#: Longest wait while some tier does not signal progress: it is polled this often.
POLL_S = 0.0002
#: Longest wait when every tier signals progress.
CAP_S = 0.002


class Progress:
    """The progress signal of one manager's ``tiers`` (each is bound to it here)."""

    def __init__(self, tiers: Sequence[SecondaryTier]) -> None:
        self._event = threading.Event()
        for tier in tiers:
            tier.bind_progress(self.notify)
        self._cap = CAP_S if all(tier.signals_progress for tier in tiers) else POLL_S

    def notify(self) -> None:
        self._event.set()

    def arm(self) -> None:
        """Forget earlier signals: call before looking at the tiers."""
        self._event.clear()

    def wait(self, timeout: float) -> bool:
        """Wait for a signal since ``arm``, ``timeout`` seconds at most; whether one came."""
        return self._event.wait(max(0.0, min(timeout, self._cap)))
