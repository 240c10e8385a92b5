"""ObjectBound: what the object tier holds, when each object was last used, and what must go.

The object tier with ``max_bytes`` or ``max_age_s`` keeps an index of the objects under its own
namespace (``<prefix>/<identity digest hex>/``):

* **What it holds**: a ``ChunkIndex`` (``tiers.shared.chunk_index``), the prefix-aware LRU the
  fs tier uses too. Stores reserve room first (``before_store``: the victims that make room are
  deleted), then commit with the chunk's predecessor (``TransferJob.links``); loads touch the
  chunk and tell the index the predecessor its header carries; a probe that finds an object
  another instance wrote adds it. Unreachable chunks (predecessor gone) go first, then the
  least recently used, a prefix from its tail.
* **When each was last used** (``UseClock``): Unix seconds of its last store or load here, or,
  for objects only a listing found, their ``LastModified`` (the time of their last write: S3
  cannot change it without rewriting the object). ``expired`` names those unused for longer
  than ``max_age_s``.
* **Deletes**: ``drop`` sends each victim to ``submit`` (the tier's I/O pool) to be deleted
  with ``delete``. A delete that succeeds is reported by ``take_removed`` (KV events) and
  counted under its reason (``evicted``, ``expired``); one that fails is counted as
  ``delete_failed.<refused|unavailable|error>`` and kept for ``retry`` (at most
  ``MAX_PENDING``; past that the oldest is given up, counted as ``delete_abandoned``), never
  an error to the engine. A key stored again before its delete runs is not deleted.

Objects whose delete failed are outside the index until retried: the bucket can then hold more
than ``max_bytes`` by those. Parents of objects a listing found and no load has read since are
not known: they count as chain heads.

Thread safety: every method may be called from any thread (the manager's, the I/O pool, the
upkeep thread); ``ChunkIndex`` and ``UseClock`` have their own locks, the rest one lock here.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence

from kvtier.errors import TierError, TierUnavailable
from kvtier.keys import ChunkKey
from kvtier.tiers.base import TransferJob
from kvtier.tiers.s3.client import ObjectRefused
from kvtier.tiers.shared.chunk_index import ChunkIndex

#: How many keys ``take_removed`` remembers at most between two calls.
MAX_REMOVED = 1 << 16
#: How many failed deletes are kept for a retry at most.
MAX_PENDING = 1 << 16

#: One chunk found by a listing: key, size in bytes, last modified (Unix seconds).
ListedChunk = tuple[ChunkKey, int, float]
Delete = Callable[[ChunkKey], None]
Submit = Callable[[Callable[[], None]], None]


class UseClock:
    """Key → time of last use (Unix seconds), least recently used first; keeps nothing when
    not ``active`` (no ``max_age_s``: about 130 bytes an object saved)."""

    def __init__(self, active: bool = True) -> None:
        self._last: OrderedDict[bytes, float] = OrderedDict()
        self._active = active
        self._lock = threading.Lock()

    def used(self, key: bytes, when: float) -> None:
        if not self._active:
            return
        with self._lock:
            self._last[key] = when
            self._last.move_to_end(key)

    def merge_old(self, found: Iterable[tuple[bytes, float]]) -> None:
        """Add keys used before any known one, given newest first; known keys keep theirs."""
        if not self._active:
            return
        with self._lock:
            for key, when in found:
                if key not in self._last:
                    self._last[key] = when
                    self._last.move_to_end(key, last=False)

    def forget(self, keys: Iterable[bytes]) -> None:
        with self._lock:
            for key in keys:
                self._last.pop(key, None)

    def take_older_than(self, cutoff: float) -> list[bytes]:
        """Remove and return the keys last used before ``cutoff``."""
        taken: list[bytes] = []
        with self._lock:
            while self._last:
                key, when = next(iter(self._last.items()))
                if when >= cutoff:
                    break
                del self._last[key]
                taken.append(key)
        return taken


class ObjectBound:
    """The index, use times and deletes of a bounded object tier (see the module docstring).

    ``delete(key)`` deletes one object (raising ``TierError``); ``submit(fn)`` runs ``fn`` on
    the tier's I/O threads; ``on_drop(key)`` is told at once of each key dropped (before its
    delete runs); ``now`` is the clock of ``max_age_s`` (Unix seconds).
    """

    def __init__(
        self,
        max_bytes: int | None,
        max_age_s: float | None,
        delete: Delete,
        submit: Submit,
        on_drop: Callable[[ChunkKey], None] = lambda key: None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.index = ChunkIndex(max_bytes)
        self.max_age_s = max_age_s
        self.now = now
        self._clock = UseClock(active=max_age_s is not None)
        self._delete, self._submit, self._on_drop = delete, submit, on_drop
        self._pending: OrderedDict[ChunkKey, str] = OrderedDict()  # failed deletes → reason
        self._removed: deque[ChunkKey] = deque(maxlen=MAX_REMOVED)
        self._counters: Counter[str] = Counter()
        self._lock = threading.Lock()

    # -- what the tier reports -----------------------------------------------------------------
    def before_store(self, nbytes: int, parent: bytes | None, key: ChunkKey) -> bool:
        """Reserve room for a put of ``nbytes`` of chunk ``key`` after ``parent`` (victims are
        dropped); ``False`` (nothing reserved) when room would take the chunk's own prefix
        (``ChunkIndex.reserve``), ``CapacityError`` when puts in flight alone fill the bound.
        Until its job ends, ``key`` counts as held for the chunks after it: puts run
        concurrently and are indexed when their job ends."""
        victims = self.index.reserve(nbytes, parent, key)
        if victims is None:
            return False
        self.drop(victims, "evicted")
        return True

    def job_done(
        self,
        job: TransferJob,
        op: str,
        written: dict[ChunkKey, int],
        succeeded: Iterable[ChunkKey],
    ) -> None:
        """A job ended: a store's puts (reserved by ``before_store``) are indexed in chain
        order, parents before children; then its keys are marked used, the head most recent."""
        self._index_puts(job, written)
        ok = set(succeeded) | written.keys()
        self.used_chain([key for key in job.keys if key in ok])

    def _index_puts(self, job: TransferJob, written: dict[ChunkKey, int]) -> None:
        for i, key in enumerate(job.keys):
            nbytes = written.get(key)
            if nbytes is not None:
                link = job.link_of(i)
                self.index.commit(key, nbytes, link.parent if link is not None else None)

    def store_failed(self, nbytes: int, key: ChunkKey) -> None:
        self.index.release(nbytes, key)

    def used(self, key: ChunkKey, parent: bytes | None = None) -> None:
        """``key`` was loaded (or stored again): most recently used; ``parent`` from its header."""
        if parent is not None:
            self.index.set_parent(key, parent)
        if self.index.touch(key):
            self._clock.used(key, self.now())

    def used_chain(self, keys: Sequence[ChunkKey]) -> None:
        """``keys``, consecutive chunks of one prefix in chain order (a job's), were stored or
        loaded: they and the chunks before them are most recently used, the head the most."""
        self.index.touch_many(keys)
        now = self.now()
        for key in reversed(keys):
            if key in self.index:
                self._clock.used(key, now)

    def found(self, key: ChunkKey, nbytes: int, since: int | None = None) -> bool:
        """A probe found ``key`` (``nbytes``), maybe written by another instance; whether it
        is indexed. Not when the probe, begun at ``since`` (``ChunkIndex.mark``), raced the
        key's eviction and delete here: then it is a miss."""
        victims = self.index.add(key, nbytes, since=since)
        if victims is None:
            return False
        self.drop(victims, "evicted")
        self._clock.used(key, self.now())
        return True

    def gone(self, key: ChunkKey) -> None:
        """``key`` is not in the bucket (any more): forget it."""
        self.index.discard(key)
        self._clock.forget((key,))

    def merge_listed(self, batch: Sequence[ListedChunk], since: int | None = None) -> None:
        """Chunks a listing found, ``batch`` newest first and older than every earlier batch;
        keys dropped after ``since`` (``ChunkIndex.mark``) are left out."""
        found = ((k, n, None) for k, n, _ in reversed(batch))
        self.drop(self.index.merge_cold(found, since), "evicted")
        self._clock.merge_old((k, when) for k, _, when in batch if k in self.index)

    # -- deletes -------------------------------------------------------------------------------
    def expire(self) -> int:
        """Drop every object unused for longer than ``max_age_s``; returns how many."""
        if self.max_age_s is None:
            return 0
        keys = [ChunkKey(k) for k in self._clock.take_older_than(self.now() - self.max_age_s)]
        for key in keys:
            self.index.discard(key, deleting=True)
        self.drop(keys, "expired")
        return len(keys)

    def drop(self, keys: Sequence[ChunkKey], reason: str) -> None:
        """Delete ``keys`` (no longer indexed) on the I/O threads."""
        self._clock.forget(keys)
        for key in keys:
            self._on_drop(key)
            self._send_delete(key, reason)

    def retry(self) -> int:
        """Send every failed delete again; returns how many."""
        with self._lock:
            pending, self._pending = self._pending, OrderedDict()
        for key, reason in pending.items():
            self._send_delete(key, reason)
        self._count("delete_retried", len(pending))
        return len(pending)

    def _send_delete(self, key: ChunkKey, reason: str) -> None:
        """Delete ``key`` on the I/O threads (a probe meanwhile finds it gone: ``found``)."""
        self._submit(functools.partial(self._delete_one, key, reason))

    def _delete_one(self, key: ChunkKey, reason: str) -> None:
        try:
            self._try_delete(key, reason)
        finally:
            self.index.deleted(key)  # a HEAD answered before the DELETE is a miss too

    def _try_delete(self, key: ChunkKey, reason: str) -> None:
        if key in self.index:  # stored again since it was dropped: keep it
            return
        try:
            self._delete(key)
        except TierError as exc:
            self._delete_failed(key, reason, _failure(exc))
            return
        self._removed.append(key)
        self._count(reason)

    def _delete_failed(self, key: ChunkKey, reason: str, why: str) -> None:
        with self._lock:
            self._counters[f"delete_failed.{why}"] += 1
            self._pending[key] = reason
            if len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)
                self._counters["delete_abandoned"] += 1

    # -- reports -------------------------------------------------------------------------------
    def take_removed(self) -> list[ChunkKey]:
        """Keys deleted since the last call."""
        removed = []
        while self._removed:
            removed.append(self._removed.popleft())
        return removed

    def stats(self) -> dict[str, int]:
        with self._lock:
            counters = dict(self._counters)
            pending = len(self._pending)
        return {
            **counters,
            "index_chunks": len(self.index),
            "index_bytes": self.index.used_bytes,
            "unreachable_chunks": self.index.unreachable_count(),
            "delete_pending": pending,
        }

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] += n


def _failure(exc: TierError) -> str:
    if isinstance(exc, ObjectRefused):
        return "refused"
    return "unavailable" if isinstance(exc, TierUnavailable) else "error"
