"""Warnings that can repeat at the rate of the data path, throttled so they never flood a log.

A tier that is down can fail every lookup and every job, thousands of times a second. The first
occurrence of each kind is logged at once; the rest within ``interval_s`` are counted and
reported with the next one logged ("... (and 4312 more like it in the last 10 s)"). The counters
of the metrics module say how often; the log says what and why.

Thread safety: ``warning`` may be called from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

INTERVAL_S = 10.0


class ThrottledLog:
    """``warning(kind, msg, *args)`` logs each ``kind`` at most once per ``interval_s``."""

    def __init__(self, logger: logging.Logger, interval_s: float = INTERVAL_S) -> None:
        self._logger, self._interval = logger, interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, kind: str, msg: str, *args: Any) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -self._interval) < self._interval:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return
            self._last[kind] = now
            skipped = self._suppressed.pop(kind, 0)
        if skipped:
            msg += f" (and {skipped} more like it in the last {self._interval:g} s)"
        self._logger.warning(msg, *args)


def log_to_stderr() -> None:
    """Give kvtier's records a handler (level, time, logger) in a process that configured none,
    such as vLLM's engine core and workers (vLLM configures only its own loggers, so kvtier's
    warnings printed bare). Does nothing where the application set up logging itself."""
    root = logging.getLogger("kvtier")
    if root.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
