"""The progress of ``kvtier cache verify``: a bar on a terminal, periodic lines otherwise.

``advance`` is called by every reader thread after each chunk; it redraws at most every
``BAR_EVERY_S`` (bar) or ``LINE_EVERY_S`` (lines) seconds, so drawing costs nothing that
matters. ``rate`` is bytes per second since ``start``.

Thread safety: ``advance`` takes the instance's lock; the rest runs on the command's thread.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from kvtier.cache.inventory import size

BAR_EVERY_S = 0.2
LINE_EVERY_S = 10.0
_WIDTH = 30


class Progress:
    """``mode``: ``bar``, ``lines``, ``none`` or ``auto`` (a bar when ``out`` is a terminal)."""

    def __init__(self, mode: str = "auto", out: TextIO | None = None) -> None:
        self._out = out or sys.stderr
        if mode == "auto":
            mode = "bar" if self._out.isatty() else "lines"
        self.mode = mode
        self._every = BAR_EVERY_S if mode == "bar" else LINE_EVERY_S
        self._lock = threading.Lock()
        self.total_chunks = self.total_bytes = self.chunks = self.bytes = 0
        self._start = self._last = time.monotonic()

    def start(self, chunks: int, nbytes: int) -> None:
        self.total_chunks, self.total_bytes = chunks, nbytes
        self._start = self._last = time.monotonic()

    def advance(self, nbytes: int) -> None:
        """One more chunk of ``nbytes`` read."""
        with self._lock:
            self.chunks += 1
            self.bytes += nbytes
            now = time.monotonic()
            if self.mode != "none" and now - self._last >= self._every:
                self._last = now
                self._draw(end="\r" if self.mode == "bar" else "\n")

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def rate(self) -> float:
        """Bytes read per second so far."""
        return self.bytes / max(self.elapsed(), 1e-9)

    def finish(self) -> None:
        """Draw the last state (a bar ends its line)."""
        if self.mode != "none":
            with self._lock:
                self._draw(end="\n")

    def _draw(self, end: str) -> None:
        done = self.bytes / self.total_bytes if self.total_bytes else 1.0
        counts = f"{self.chunks}/{self.total_chunks} chunks"
        amounts = f"{size(self.bytes)}/{size(self.total_bytes)}, {size(int(self.rate()))}/s"
        text = f"verify: {counts}, {amounts}"
        if self.mode == "bar":
            filled = int(_WIDTH * min(done, 1.0))
            text = f"[{'#' * filled}{'.' * (_WIDTH - filled)}] {100 * done:3.0f}% {text}"
        print(text, end=end, file=self._out, flush=True)
