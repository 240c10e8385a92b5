"""CloseOnce: the close of an object that any thread may close, any number of times.

The first ``close`` claims it (under the owner's lock) and runs it. A ``close`` from another
thread meanwhile waits until the first has finished, at most its own timeout; one from the
claiming thread itself (a service closing its owner from inside the owner's ``close``) returns
at once instead of waiting for itself.

Thread safety: any thread; ``claim`` under the owner's lock, once.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class CloseOnce:
    """Who runs the close, and whether it has finished; see the module docstring."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._done = threading.Event()
        self._closer = -1  # thread ident of the claiming thread

    def claim(self) -> None:
        """The calling thread runs the close."""
        self._closer = threading.get_ident()

    def finished(self) -> None:
        """The close has run (also when it raised)."""
        self._done.set()

    def wait(self, timeout: float | None) -> bool:
        """A later ``close``: wait up to ``timeout`` s (``None``: for good) for the first to
        finish; whether it did (or this thread runs it). Logs when it did not."""
        if self._closer == threading.get_ident():
            return True
        bound = timeout if timeout is None or timeout < threading.TIMEOUT_MAX else None
        if self._done.wait(bound):
            return True
        log.warning("close: another thread still closing the %s after %s s", self._what, timeout)
        return False
