"""How the fs tier finds out about a key it has not seen: ``Prober``, inline or on threads.

A lookup of a key the tier has not seen needs one ``stat`` of its path. On a local file system
that is a few microseconds, cheaper than handing it to a probe thread and waiting for its
answer (the engine then asks again: a round trip of 0.4 ms median, 3.6 ms p90, on a quiet
2-CPU machine, paid by every request whose prompt ends in new chunks). On a network file
system a ``stat`` can take a server's timeout, or forever, and must never run on the engine's
thread.

So ``probe: "auto"`` stats inline where ``statfs`` names a local file system (``LOCAL``: a
list of known types; anything else, FUSE included, is treated as remote), and on probe threads
everywhere else; ``"inline"`` and ``"background"`` force one way.

Thread safety: ``Prober.ask`` from the lookup's thread (inline probes run there), background
probes on the prober's threads; the rest are plain functions for any thread.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from typing import Literal

from kvtier.keys import ChunkKey
from kvtier.tiers.base import HIT, MISS, RETRY, Lookup
from kvtier.tiers.fs.paths import libc_function
from kvtier.tiers.shared.probes_in_flight import ProbesInFlight
from kvtier.tiers.shared.workers import WorkerPool

#: Threads that answer lookups of unknown keys in the background (one ``stat`` each).
N_PROBE_THREADS = 4

ProbeMode = Literal["auto", "inline", "background"]

#: ``statfs``'s ``f_type`` of file systems on local block devices or in memory.
LOCAL = {
    0xEF53: "ext2/ext3/ext4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0xF2F52010: "f2fs",
    0x2FC12FC1: "zfs",
    0xCA451A4E: "bcachefs",
    0x01021994: "tmpfs",
    0x858458F6: "ramfs",
    0x794C7630: "overlayfs",
}
#: ``struct statfs`` is at most this big on Linux; ``f_type`` is its first field (a long).
_STATFS_BYTES = 256


def filesystem_type(path: str) -> int | None:
    """``statfs(path).f_type``; ``None`` off Linux or when ``statfs`` fails."""
    statfs = libc_function("statfs")
    if statfs is None:
        return None
    buffer = ctypes.create_string_buffer(_STATFS_BYTES)
    if statfs(os.fsencode(path), buffer) != 0:
        return None
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF


def probes_inline(mode: ProbeMode, path: str) -> bool:
    """Whether lookups under ``path`` stat unknown keys on the caller's thread (see above)."""
    if mode != "auto":
        return mode == "inline"
    return filesystem_type(path) in LOCAL


class Prober:
    """Answers ``ask(key)`` with ``probe(key)`` (whether the file is there; it records the
    answer): at once when ``inline``, else ``RETRY`` while a probe thread calls it, after which
    ``notify()`` (the tier's progress signal) wakes the lookups waiting. One probe per key at
    a time, ``ProbesInFlight``'s limit at once: past that ``MISS``, and
    ``count("probe_skipped_backlog")``."""

    def __init__(
        self,
        name: str,
        inline: bool,
        probe: Callable[[ChunkKey], bool],
        notify: Callable[[], None],
        count: Callable[[str], None],
    ) -> None:
        self.inline = inline
        self._probe, self._notify, self._count = probe, notify, count
        self._pool = WorkerPool(N_PROBE_THREADS, f"{name}-probe")
        self._probing = ProbesInFlight()
        self._lock = threading.Lock()

    def ask(self, key: ChunkKey, may_inline: bool = True) -> Lookup:
        """``HIT``/``MISS`` inline (unless ``may_inline`` is false), else ``RETRY``."""
        if self.inline and may_inline:
            return HIT if self._probe(key) else MISS
        with self._lock:
            answer = self._probing.claim(key)
            if answer is None:
                self._pool.submit(functools.partial(self._run, key))
        if answer is MISS:
            self._count("probe_skipped_backlog")
        return RETRY if answer is None else answer

    def _run(self, key: ChunkKey) -> None:
        try:
            self._probe(key)
        finally:
            with self._lock:
                self._probing.done(key)
            self._notify()  # the key's RETRY is now a HIT or a MISS

    def close(self, timeout: float) -> list[str]:
        """Drop queued probes, stop the threads (``WorkerPool.close``); those still busy."""
        return self._pool.close(timeout, cancel=True)
