"""``kvtier cache verify``: read every chunk back and check it, in parallel, in bounded memory.

Each chunk is checked as a tier checks it before serving it: the header (``codec``), the
identity digest against its namespace's name, the key against its file or object name, the
length, and the checksum (version 1: hashed while reading, ``READ_STEP`` at a time) or, with
an integrity key, the tag (version 2, ``sealing``). Without the key a sealed chunk is counted
``sealed_unverified``: not bad, not checked.

``jobs`` reader threads each reuse one buffer (``Scratch``) as large as the largest chunk they
read; at most ``2 * jobs`` chunks are queued, so memory is ``jobs`` chunks whatever the cache's
size. A chunk larger than ``max_chunk_bytes`` (by its size, or by what its header claims) is
not read: it is counted ``too_large``, neither good nor bad, and never removed. A chunk deleted
while verify runs (a server evicted it) is counted ``vanished``, which is not a fault of the
cache. With ``repair`` a bad chunk is removed: only the chunk file or object that was read (fs:
unless a writer replaced it meanwhile).

Thread safety: ``Verifier.run`` runs on the caller's thread and starts its readers; counters
are kept under ``Problems``'s and the report's lock.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kvtier.cache.progress import Progress
from kvtier.cache.records import Problems
from kvtier.cache.store import MAX_CHUNK_BYTES, ChunkRead, ChunkTooLarge, Scratch, Store
from kvtier.errors import IntegrityError, KVTierError
from kvtier.tiers.fs.paths import failure_reason
from kvtier.tiers.shared import codec
from kvtier.tiers.shared.sealing import Sealer

_UNVERIFIED = "sealed_unverified"


@dataclass
class VerifyReport:
    """What ``run`` found: chunks checked and their bytes, bad ones by reason, removed ones."""

    chunks: int = 0
    bytes: int = 0
    good: int = 0
    bad: Counter[str] = field(default_factory=Counter)
    removed: int = 0
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def rate(self) -> float:
        """Bytes read per second."""
        return self.bytes / max(self.seconds, 1e-9)


class Verifier:
    """Verifies every chunk of ``store``; ``sealer``: a keyed sealer for version-2 chunks."""

    def __init__(
        self,
        store: Store[Any],
        problems: Problems,
        progress: Progress,
        *,
        jobs: int = 4,
        repair: bool = False,
        sealer: Sealer | None = None,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
    ) -> None:
        self._store, self._problems, self._progress = store, problems, progress
        self._jobs, self._repair, self._sealer = jobs, repair, sealer
        self._max_chunk_bytes = max_chunk_bytes
        self._local = threading.local()
        self.report = VerifyReport()

    def run(self) -> VerifyReport:
        """Check every chunk of every namespace; returns (and keeps) the report."""
        namespaces = self._store.namespaces(self._problems)
        self._progress.start(*self._totals(namespaces))
        slots = threading.BoundedSemaphore(2 * self._jobs)
        with ThreadPoolExecutor(self._jobs, thread_name_prefix="kvtier-verify") as pool:
            for ns in namespaces:
                for name, size in self._store.names(ns, self._problems):
                    slots.acquire()
                    job = pool.submit(self._check, ns, name, size)
                    job.add_done_callback(lambda _: slots.release())
        self._progress.finish()
        self.report.seconds = self._progress.elapsed()
        return self.report

    def _totals(self, namespaces: list[Any]) -> tuple[int, int]:
        """Chunks and bytes, for the progress bar (a listing without links; its problems are
        counted by the reading pass, not twice)."""
        quiet = Problems()
        usages = [self._store.usage(ns, quiet, links=False) for ns in namespaces]
        return sum(u.chunks for u in usages), sum(u.bytes for u in usages)

    def _check(self, ns: Any, name: str, size: int) -> None:
        """Read and judge one chunk; nothing escapes (a reader thread's result is not read)."""
        where = self._store.path(ns, name)
        try:
            self._check_one(ns, name, size, where)
        except Exception as exc:  # a bug must still be a line, not a lost future
            self._problems.note("error", where, f"{type(exc).__name__}: {exc}")

    def _check_one(self, ns: Any, name: str, size: int, where: str) -> None:
        scratch = self._scratch()
        try:
            got = self._store.read(ns, name, size, scratch)
        except IntegrityError as exc:  # an object longer than listed
            self._bad(ns, name, where, None, f"{exc.reason}: {exc}")
            return
        except ChunkTooLarge as exc:  # neither read nor judged: maybe a real, huge chunk
            self._problems.note("too_large", where, f"not read: {exc}")
            return
        except (OSError, KVTierError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            kind = failure_reason(exc) if isinstance(exc, OSError) else "unreadable"
            self._problems.note(kind, where, f"cannot read: {why}")
            return
        if got is None:
            self._problems.note("vanished", where, "deleted while verify ran", quiet=True)
            return
        nbytes = len(got.header) + len(got.payload)
        self._progress.advance(nbytes)
        reason = self._judge(got, bytes.fromhex(ns.digest), bytes.fromhex(name), where)
        with self.report.lock:
            self.report.chunks += 1
            self.report.bytes += nbytes
            self.report.good += reason is None
        if reason is not None and reason != _UNVERIFIED:
            self._bad(ns, name, where, got.seen, reason)

    def _judge(self, got: ChunkRead, digest: bytes, key: bytes, where: str) -> str | None:
        """``None`` when the chunk is good, ``_UNVERIFIED`` when it is sealed and no key was
        given, else why it is bad."""
        try:
            if codec.format_version(got.header) != codec.SEALED_VERSION:
                codec.verify(got.header, got.payload, digest, key, got.checksum)
            elif self._sealer is None:
                self._problems.note(_UNVERIFIED, where, quiet=True)
                return _UNVERIFIED
            else:
                self._sealer.open(got.header, got.payload, digest, key)
        except IntegrityError as exc:
            return f"{exc.reason}: {exc}"
        return None

    def _bad(self, ns: Any, name: str, where: str, seen: object, reason: str) -> None:
        with self.report.lock:
            self.report.bad[reason.split(":")[0]] += 1
        removed = self._repair and self._store.remove_bad(ns, name, seen)
        self._problems.note("bad_chunk", where, reason + ("; removed" if removed else ""))
        if removed:
            with self.report.lock:
                self.report.removed += 1

    def _scratch(self) -> Scratch:
        scratch: Scratch | None = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = Scratch(self._max_chunk_bytes)
        return scratch
