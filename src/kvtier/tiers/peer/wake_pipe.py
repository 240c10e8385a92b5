"""WakePipe: how another thread wakes a transport's thread out of its ``poll``.

``fd`` is the read end, polled with the transport's sockets; ``wake`` writes a byte, ``drain``
empties the pipe. ``wake`` after ``close`` does nothing: it never writes to a closed
descriptor, nor to another file that reused its number.

Thread safety: ``wake`` and ``close`` from any thread (a lock orders them); ``drain`` on the
transport's thread.
"""

from __future__ import annotations

import contextlib
import os
import threading


class WakePipe:
    """A nonblocking pipe; see the module docstring."""

    def __init__(self) -> None:
        self.fd, self._write = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write, False)
        self._lock = threading.Lock()

    def wake(self) -> None:
        with self._lock:
            if self._write >= 0:
                with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
                    os.write(self._write, b"w")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.fd, 4096):
                pass

    def close(self) -> None:
        with self._lock:
            if self._write >= 0:
                os.close(self._write)
                os.close(self.fd)
                self._write = -1
