"""WorkerPool: daemon threads that run callables in submission order, and a close that returns.

A tier's jobs and probes run here rather than on a ``concurrent.futures.ThreadPoolExecutor``,
whose ``shutdown`` and interpreter exit both join every worker, however long it takes: one
write stuck on a dead NFS server would hang the manager's ``close`` and then the process's
exit. ``close(timeout)`` joins for ``timeout`` seconds at most and returns the workers still
busy; being daemon threads, they never keep the process alive.

Threads start as work comes, up to ``size``: an idle worker takes the next callable first.

Thread safety: ``submit`` and ``close`` from any thread; the callables run on the workers.
A callable must not raise (its exception is logged and the worker goes on).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: How long a tier's ``close`` waits for its busy workers before leaving them behind.
CLOSE_WAIT_S = 10.0


class WorkerPool:
    """At most ``size`` daemon threads named ``<prefix>_<i>``, started as work comes."""

    def __init__(self, size: int, prefix: str) -> None:
        self._size, self._prefix = max(1, size), prefix
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, fn: Callable[[], None]) -> bool:
        """Queue ``fn``; False (not queued) once ``close`` was called."""
        with self._lock:
            if self._closed:
                return False
            self._work.put(fn)
            if self._idle.acquire(blocking=False) or len(self._threads) >= self._size:
                return True
            name = f"{self._prefix}_{len(self._threads)}"
            thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._threads.append(thread)
        thread.start()
        return True

    def _run(self) -> None:
        while (fn := self._work.get()) is not None:
            try:
                fn()
            except Exception:  # a worker outlives what it runs
                log.exception("%s: a task failed", self._prefix)
            self._idle.release()

    def close(self, timeout: float | None = None, cancel: bool = False) -> list[str]:
        """Run what is queued (``cancel``: drop it), stop the workers; the names of those still
        busy after ``timeout`` seconds (default ``CLOSE_WAIT_S``; left running, daemon).
        Idempotent."""
        timeout = CLOSE_WAIT_S if timeout is None else timeout
        with self._lock:
            self._closed, threads = True, list(self._threads)
            while cancel and not self._work.empty():
                self._work.get_nowait()
            for _ in threads:
                self._work.put(None)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(left(deadline))
        return [thread.name for thread in threads if thread.is_alive()]


def left(deadline: float) -> float:
    """Seconds from now until ``deadline`` (a ``time.monotonic()`` time), 0 if past."""
    return max(0.0, deadline - time.monotonic())
