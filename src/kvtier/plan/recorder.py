"""``TraceRecorder``: serving engines record a kvtier trace with bounded overhead.

``record(...)`` runs on the serving thread and only appends a tuple to a bounded buffer under
a lock (no formatting, no I/O); when ``max_pending`` records wait, new ones are dropped and
counted (``dropped``), never waited for. A daemon writer thread wakes every
``flush_interval_s`` (sooner when the buffer is half full), formats the waiting records as
trace lines (``kvtier.plan.trace``) and writes them in one call. Any ``OSError`` (an unwritable
path, a full disk, a removed directory) turns recording off with one warning; ``record`` then
returns at once and serving goes on. ``close()`` (also run at interpreter exit) writes what
waits and stops the thread.

``record`` takes ownership of ``chunk_keys``: the caller must not change that list afterwards.
Keys may be kvtier ``ChunkKey``s or any bytes (their first 8 bytes are kept) or integers
(vLLM block hashes; kept modulo 2**64).

Wiring an engine: build one ``TraceRecorder(path, chunk_tokens)`` per process, call
``record(prompt_tokens, chunk_keys, output_tokens)`` once per finished request, ``close()`` at
shutdown. ``open_recorder(manager, chunk_tokens)`` builds it from the manager's
``config.trace_path`` (``None`` when unset).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from kvtier.plan.trace import TraceWriter, key_of, request_line

logger = logging.getLogger("kvtier.plan")

_Record = tuple[float, int, Sequence[Any], int, "str | int | None", "str | int | None"]


class TraceRecorder:
    """Appends requests to the trace at ``path`` from any thread (see the module docstring)."""

    def __init__(
        self,
        path: str,
        chunk_tokens: int,
        *,
        max_pending: int = 65_536,
        flush_interval_s: float = 1.0,
        source: str = "",
    ) -> None:
        self.path, self.max_pending, self.flush_interval_s = path, max_pending, flush_interval_s
        self.dropped = self.written = 0
        self._pending: list[_Record] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._file: Any = None
        try:
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
            TraceWriter(self._file, chunk_tokens, source=source or "kvtier TraceRecorder")
            self._file.flush()
        except (OSError, ValueError) as exc:
            self._disable(exc)
            return
        self._thread = threading.Thread(target=self._run, name="kvtier-trace", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def record(
        self,
        prompt_tokens: int,
        chunk_keys: Sequence[Any],
        output_tokens: int = 0,
        request_id: str | int | None = None,
        session: str | int | None = None,
        t: float | None = None,
    ) -> None:
        """Queue one finished request (serving thread; never blocks on I/O)."""
        if self._file is None:
            return
        item = (
            time.time() if t is None else t,
            prompt_tokens,
            chunk_keys,
            output_tokens,
            request_id,
            session,
        )
        with self._lock:
            if len(self._pending) >= self.max_pending:
                self.dropped += 1
                return
            self._pending.append(item)
            if len(self._pending) * 2 >= self.max_pending:
                self._wake.set()

    def close(self, timeout: float = 5.0) -> None:
        """Write what waits and stop the writer thread (idempotent)."""
        atexit.unregister(self.close)
        self._stop = True
        self._wake.set()
        thread = getattr(self, "_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- writer thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self._flush()
        self._flush()
        if self._file is not None:
            self._file.close()
            self._file = None

    def _flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch or self._file is None:
            return
        lines = []
        for record in batch:
            try:
                lines.append(self._line(*record))
            except (ValueError, TypeError, OverflowError):  # a record the caller got wrong
                self.dropped += 1
        try:
            self._file.write("".join(lines))
            self._file.flush()
            self.written += len(lines)
        except (OSError, ValueError) as exc:
            self._disable(exc)

    @staticmethod
    def _line(
        t: float,
        prompt: int,
        keys: Sequence[Any],
        output: int,
        request_id: str | int | None,
        session: str | int | None,
    ) -> str:
        return request_line(t, prompt, [key_of(k) for k in keys], output, request_id, session)

    def _disable(self, exc: BaseException) -> None:
        logger.warning("kvtier: trace recording to %s is off: %s", self.path, exc)
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()


def open_recorder(manager: Any, chunk_tokens: int) -> TraceRecorder | None:
    """A recorder for ``manager.config.trace_path``; ``None`` without a manager or a path."""
    path = getattr(getattr(manager, "config", None), "trace_path", None)
    return None if not path else TraceRecorder(path, chunk_tokens)
