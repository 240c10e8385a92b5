"""Engine processes the bench starts end with it, even when it is killed.

The bench starts engine servers in their own session (``start_new_session``), so that ``stop``
can end a server and every process it started at once. A session outlives its parent: a bench
killed by ``SIGKILL``, or by a ``SIGTERM`` that skips its ``finally`` blocks, would leave
servers holding memory, cores and ports. ``die_with_parent(os.getpid())`` (a ``preexec_fn``)
asks Linux to send the server ``SIGTERM`` when the bench's process dies (``PR_SET_PDEATHSIG``),
which ends the server as ``stop`` would. Elsewhere it does nothing.

Thread safety: runs in the child between fork and exec; it only calls ``prctl``. Linux sends
the signal when the thread that started the child ends, so start servers from a thread that
lives as long as they should (the bench's main thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> Callable[[], None]:
    """A ``preexec_fn`` for children of process ``parent`` (this one): the child is sent
    ``SIGTERM`` when ``parent`` dies (Linux only; elsewhere nothing)."""

    def in_child() -> None:
        if not sys.platform.startswith("linux"):
            return
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # it died before prctl: no signal would come
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child
