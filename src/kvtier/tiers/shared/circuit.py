"""CircuitBreaker: stop calling a remote service that keeps failing, and probe until it is back.

Any tier that talks to a remote service (an object store, a peer) records the outcome of each
request. After ``failure_threshold`` consecutive failures the circuit *opens*: callers check
``allow()`` and skip the service at once instead of waiting on timeouts. While it is open, a
background thread calls ``probe`` with exponential backoff (``backoff_min_s`` doubling up to
``backoff_max_s``); the first probe that returns without raising calls ``on_close`` and then
*closes* the circuit. A service that is down at start is modelled by ``trip()``: the circuit
starts open.

States are small integers so they can be exported as a gauge: ``CLOSED`` (0) and ``OPEN`` (1).

``Backoff`` is the retry schedule itself (a delay that doubles from a minimum to a maximum and
resets on success), shared by the breaker's probe thread and by tiers that retry on their own
I/O thread (a peer link reconnecting).

Thread safety: every method may be called from any thread; state is guarded by one lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

CLOSED, OPEN = 0, 1


class Backoff:
    """Delays that double from ``min_s`` up to ``max_s``; ``reset`` after a success.

    Thread safety: none; each user owns its own.
    """

    def __init__(self, min_s: float, max_s: float) -> None:
        self.min_s, self.max_s = min_s, max(min_s, max_s)
        self._next = min_s

    def next_delay(self) -> float:
        """The delay to wait now; the following one is twice as long (up to ``max_s``)."""
        delay, self._next = self._next, min(2 * self._next, self.max_s)
        return delay

    def reset(self) -> None:
        self._next = self.min_s

    def give_up(self) -> None:
        """Wait the longest from now on (e.g. a peer refused us: retrying soon is pointless)."""
        self._next = self.max_s


class CircuitBreaker:
    """Counts consecutive failures of ``name``; opens at the threshold, probes until it closes."""

    def __init__(
        self,
        name: str,
        probe: Callable[[], object],
        *,
        failure_threshold: int = 3,
        backoff_min_s: float = 0.5,
        backoff_max_s: float = 30.0,
        on_close: Callable[[], object] | None = None,
    ) -> None:
        self.name = name
        self._probe, self._on_close = probe, on_close
        self._threshold = max(1, failure_threshold)
        self._backoff = Backoff(backoff_min_s, backoff_max_s)
        self._lock = threading.Lock()
        self._state, self._failures = CLOSED, 0
        self.num_opened = self.num_probes = 0
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._probe_loop, name=f"{name}-probe", daemon=True)
        self._thread.start()

    @property
    def state(self) -> int:
        return self._state

    def allow(self) -> bool:
        """Whether a request may go out now (the circuit is closed)."""
        return self._state == CLOSED

    def record_success(self) -> None:
        self._failures = 0

    def record_failure(self, reason: str) -> None:
        """Count a failed request; opens the circuit at the threshold."""
        with self._lock:
            self._failures += 1
            if self._state == OPEN or self._failures < self._threshold:
                return
        self.trip(f"{self._threshold} consecutive failures, last: {reason}")

    def trip(self, reason: str) -> None:
        """Open the circuit now (e.g. the service is unreachable at start)."""
        with self._lock:
            if self._state == OPEN:
                return
            self._state = OPEN
            self.num_opened += 1
        log.warning("%s: circuit open (%s); probing with backoff", self.name, reason)
        self._wake.set()

    def close(self) -> None:
        """Stop the probe thread and join it."""
        self._stop.set()
        self._wake.set()
        self._thread.join()

    def _probe_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            self._backoff.reset()
            while self._state == OPEN and not self._stop.wait(self._backoff.next_delay()):
                if self._try_probe():
                    break

    def _try_probe(self) -> bool:
        self.num_probes += 1
        try:
            self._probe()
        except Exception as exc:
            log.debug("%s: probe failed: %s", self.name, exc)
            return False
        if self._on_close is not None:  # before requests flow again: they see its effect
            self._on_close()
        with self._lock:
            self._state, self._failures = CLOSED, 0
        log.warning("%s: circuit closed; the service answers again", self.name)
        return True
