"""ChunkIndex: what a tier holds, in the order it gives chunks up, bounded by ``max_bytes``.

The one rule for which stored chunk goes first, used by the fs tier, the obj tier and
``kvtier cache gc``:

1. **Unreachable chunks first.** A prefix lookup reaches a chunk only through its predecessors
   (``lineage``); a chunk whose predecessor (or any earlier chunk of its chain) is not held can
   never be served. Such chunks go first, those that became unreachable earliest first. One
   whose chain is stored again becomes reachable again.
2. **Then least recently used, a prefix from its tail.** Using a chunk uses its whole prefix,
   so ``touch_many`` and ``merge_cold`` keep every chunk more recent than its descendants:
   eviction cuts a chain from its tail and never leaves a tail without its head.

Chunks whose predecessor is not known (``parent`` ``None``: the first of a chain, or written
without a link) count as heads. ``used_bytes`` counts indexed chunks plus *reservations* (bytes
of writes in flight, from ``reserve`` to ``commit`` or ``release``), so what is stored never
exceeds the bound, even while being written.

Without ``max_bytes`` the index may be given ``max_chunks``: past it the coldest entries (in the
same order) are *forgotten*, not returned for deletion. An index that mirrors a directory other
writers also delete from keeps entries of files that are gone, until something looks them up;
forgotten, a live chunk is found again by a probe. With ``max_bytes`` every entry counts
against the bound, so nothing is forgotten (an entry dropped would escape the bound).

A look at the store (a listing, a probe) runs beside writes and evictions: it may see a chunk
whose delete has not run yet. The index numbers each key it evicts or is told to discard, and
again when the caller says its delete ended (``deleted``; the last ``MAX_DROPPED_REMEMBERED``
keys). ``mark`` before the look: ``add`` or ``merge_cold`` given that mark skip the keys
dropped or deleted after it, and those evicted whose delete has not ended (every key an index
method returns as evicted is the caller's to delete, then to report ``deleted``). Re-indexed,
such a chunk would be evicted, deleted and counted a second time, or, without a bound,
announced as held while its file is gone, and it could evict a live chunk to make room for
itself.

No I/O: callers delete the victims every method returns. Thread safety: every public method
takes the instance's lock.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence

from kvtier.errors import CapacityError
from kvtier.keys import ChunkKey
from kvtier.tiers.shared.drops import Drops

#: A chunk found by a listing: key, size in bytes, and its predecessor's key where known.
Found = tuple[ChunkKey, int, "bytes | None"]


class ChunkIndex:
    """Key → size, with predecessors, in eviction order; see the module docstring."""

    def __init__(self, max_bytes: int | None, max_chunks: int | None = None) -> None:
        if max_chunks is not None and max_chunks < 1:
            raise ValueError(f"max_chunks must be at least 1, got {max_chunks}")
        self.max_bytes = max_bytes
        self.max_chunks = None if max_bytes is not None else max_chunks
        self._forgotten = 0  # entries dropped past max_chunks
        self._sizes: OrderedDict[bytes, int] = OrderedDict()  # coldest first
        self._parents: dict[bytes, bytes] = {}
        self._children: dict[bytes, list[bytes]] = {}
        self._lost: OrderedDict[bytes, None] = OrderedDict()  # unreachable, first lost first
        self._pending: dict[bytes, bytes | None] = {}  # being written → its parent
        # Why counted: jobs of two requests may write the same chunk at once; the first to end
        # must not take the other's mark (its children would turn orphans, a listing would
        # index it beside its reservation). Each announcement and reservation holds one claim.
        self._claims: Counter[bytes] = Counter()
        self._indexed = 0
        self._reserved = 0
        self._drops = Drops()  # under this lock
        self._lock = threading.Lock()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._sizes

    def __len__(self) -> int:
        with self._lock:
            return len(self._sizes)

    @property
    def used_bytes(self) -> int:
        """Bytes of indexed chunks plus reservations of writes in flight."""
        with self._lock:
            return self._indexed + self._reserved

    def unreachable_count(self) -> int:
        """Indexed chunks that no prefix lookup can reach."""
        with self._lock:
            return len(self._lost)

    def forgotten_count(self) -> int:
        """Entries forgotten past ``max_chunks`` so far."""
        with self._lock:
            return self._forgotten

    # -- use ---------------------------------------------------------------------------------
    def touch(self, key: ChunkKey) -> bool:
        """Mark ``key`` (and its prefix) most recently used; ``False`` if it is not indexed."""
        with self._lock:
            return self._touch_chain([key]) > 0

    def touch_many(self, keys: Sequence[ChunkKey]) -> int:
        """Mark ``keys``, consecutive chunks of one prefix in chain order, and the chunks
        before them most recently used; returns how many of ``keys`` are indexed."""
        with self._lock:
            return self._touch_chain(keys)

    def _touch_chain(self, keys: Sequence[ChunkKey]) -> int:
        found = 0
        for key in reversed(keys):  # the head ends most recent
            if key in self._sizes:
                self._sizes.move_to_end(key)
                found += 1
        if keys:
            self._touch_ancestors(keys[0])
        return found

    def _touch_ancestors(self, key: bytes) -> None:
        parent = self._parents.get(key)
        if parent is not None:
            self._touch_ancestors_from(parent)

    def _touch_ancestors_from(self, parent: bytes) -> None:
        """Move ``parent`` and the held chunks before it to the MRU end, the head last."""
        seen: set[bytes] = set()
        node: bytes | None = parent
        while node is not None and node not in seen:
            if node in self._sizes:
                self._sizes.move_to_end(node)
            elif node not in self._pending:
                return
            seen.add(node)
            node = self._before(node)

    def _spares(self, nbytes: int, parent: bytes) -> bool:
        """Whether a write after ``parent`` must be skipped rather than evict what it would."""
        held = parent in self._sizes or parent in self._pending
        orphan = not held or parent in self._lost
        if not orphan:
            self._touch_ancestors_from(parent)
        victims = self._would_evict(nbytes)
        if orphan:
            return any(v not in self._lost for v in victims)
        return any(self._is_ancestor(v, parent) for v in victims)

    def _before(self, key: bytes) -> bytes | None:
        """The chunk before ``key``, held or being written, where known."""
        parent = self._parents.get(key)
        return parent if parent is not None or key in self._sizes else self._pending.get(key)

    def _is_ancestor(self, candidate: bytes, parent: bytes) -> bool:
        """Whether ``candidate`` is ``parent`` or a held chunk before it."""
        seen: set[bytes] = set()
        node: bytes | None = parent
        while node is not None and node not in seen:
            if node == candidate:
                return True
            seen.add(node)
            node = self._before(node)
        return False

    # -- writes ------------------------------------------------------------------------------
    def reserve(
        self, nbytes: int, parent: bytes | None = None, key: bytes | None = None
    ) -> list[ChunkKey] | None:
        """Reserve room for a write of ``nbytes``, chunk ``key`` preceded by ``parent``
        (``None``: a head); returns the keys evicted to make it. While ``key`` is being
        written (until ``commit`` or ``release`` with it) a chunk after it counts it as held.

        ``None`` (nothing reserved or evicted) when room could only be made by evicting
        ``parent`` or a chunk before it (a prefix longer than the bound keeps its head, and
        its tail is not written), or by evicting a reachable chunk for one that is not (its
        ``parent`` is not held). Raises ``CapacityError`` (reserving nothing) when writes in
        flight alone fill the bound.
        """
        with self._lock:
            if parent is not None and self.max_bytes is not None and self._spares(nbytes, parent):
                return None
            victims = self._evict_for(nbytes)
            if victims is None:
                raise CapacityError(f"max_bytes={self.max_bytes} is taken by writes in flight")
            self._reserved += nbytes
            if key is not None:
                self._pending[key] = parent
                self._claims[key] += 1
            return victims

    def expect(self, chain: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Writes of (key, parent) announced when their job is submitted, in order: until
        ``commit``, ``release`` or ``forget``, each counts as being written. Jobs of one chain
        run on several threads, and a chunk may reserve before its parent does; announced, the
        parent is not taken for missing and the chunk for an orphan."""
        with self._lock:
            for key, parent in chain:
                self._pending.setdefault(key, parent)
                self._claims[key] += 1

    def forget(self, keys: Iterable[bytes]) -> None:
        """A job ended: what it announced (``expect``) is no longer pending, unless another
        job's announcement or write of the same key still is."""
        with self._lock:
            for key in keys:
                self._unclaim(key)

    def release(self, nbytes: int, key: bytes | None = None) -> None:
        """Give back a reservation whose write failed."""
        with self._lock:
            self._reserved -= nbytes
            if key is not None:
                self._unclaim(key)

    def commit(self, key: ChunkKey, nbytes: int, parent: bytes | None = None) -> None:
        """A reserved write of ``key`` landed: the reservation becomes its entry (MRU)."""
        with self._lock:
            self._reserved -= nbytes
            self._unclaim(key)
            self._insert(key, nbytes, parent)
            self._forget_over()

    def add(
        self, key: ChunkKey, nbytes: int, parent: bytes | None = None, since: int | None = None
    ) -> list[ChunkKey] | None:
        """A chunk found stored (MRU); returns the keys evicted to stay under the bound. A key
        being written is left to its ``commit``: indexed now, its bytes would count twice.
        ``None`` (nothing indexed) when ``key`` was dropped after ``mark`` returned ``since``:
        what found it ran beside its delete."""
        with self._lock:
            if key in self._sizes:
                self._sizes.move_to_end(key)
                self._learn_parent(key, parent)
                return []
            if self._drops.raced(key, since):
                return None
            if key in self._pending:
                return []
            self._insert(key, nbytes, parent)
            self._forget_over()
            return self._evict_for(0) or []

    def set_parent(self, key: ChunkKey, parent: bytes | None) -> None:
        """Record the predecessor of indexed ``key``, learnt after it was added (from a read)."""
        with self._lock:
            if key in self._sizes:
                self._learn_parent(key, parent)

    def mark(self) -> int:
        """Taken before a look at the store (a listing, a probe), and given to ``add`` or
        ``merge_cold`` with what it found: keys dropped after it are not indexed again."""
        with self._lock:
            return self._drops.mark()

    def deleted(self, key: ChunkKey) -> None:
        """The delete of evicted ``key`` ended (its file or object is gone, or stays: a failed
        delete): its drop is numbered again, so that a look that began before the delete, and
        saw the chunk still there, skips it too. Nothing for a key indexed again meanwhile."""
        with self._lock:
            self._drops.deleted(key, indexed=key in self._sizes)

    def merge_cold(self, found: Iterable[Found], since: int | None = None) -> list[ChunkKey]:
        """Add chunks found by a listing, given least recently used first, below every known
        key; keys already indexed keep their place. Returns the keys evicted to stay under the
        bound, in eviction order (what ``kvtier cache gc`` deletes). A key being written (a
        listing that ran beside its put) is left to its ``commit``, as in ``add``, and one
        dropped after ``mark`` returned ``since`` is left out."""
        with self._lock:
            for key, nbytes, parent in reversed(_prefix_order(list(found))):
                fresh = key not in self._sizes and key not in self._pending
                if fresh and not self._drops.raced(key, since):
                    self._insert(key, nbytes, parent)
                    self._sizes.move_to_end(key, last=False)
            self._forget_over()
            return self._evict_for(0) or []

    def discard(self, key: ChunkKey, deleting: bool = False) -> bool:
        """Forget ``key`` (its chunk is gone or bad; with ``deleting``, about to be deleted,
        until ``deleted``); ``False`` if it was not indexed."""
        with self._lock:
            self._drops.note(key, deleting)
            return self._remove(key)

    # -- internals (lock held) ---------------------------------------------------------------
    def _unclaim(self, key: bytes) -> None:
        """One announcement or reservation of ``key`` ended; the last one ends its mark."""
        if self._claims[key] > 1:
            self._claims[key] -= 1
        else:
            self._claims.pop(key, None)
            self._pending.pop(key, None)

    def _insert(self, key: ChunkKey, nbytes: int, parent: bytes | None) -> None:
        self._indexed += nbytes - self._sizes.pop(key, 0)  # a key written twice is replaced
        self._sizes[key] = nbytes
        self._learn_parent(key, parent)
        if key not in self._lost:
            self._revive(key)

    def _learn_parent(self, key: ChunkKey, parent: bytes | None) -> None:
        if parent is None or self._parents.get(key) == parent:
            return
        self._unlink(key)
        self._parents[key] = parent
        self._children.setdefault(parent, []).append(key)
        if parent not in self._sizes or parent in self._lost:
            self._lose(key)
        elif key in self._lost:
            del self._lost[key]
            self._revive(key)

    def _unlink(self, key: bytes) -> None:
        parent = self._parents.pop(key, None)
        if parent is None:
            return
        siblings = self._children[parent]
        siblings.remove(key)
        if not siblings:
            del self._children[parent]

    def _remove(self, key: bytes) -> bool:
        nbytes = self._sizes.pop(key, None)
        if nbytes is None:
            return False
        self._indexed -= nbytes
        self._lost.pop(key, None)
        self._unlink(key)
        for child in self._children.get(key, ()):
            self._lose(child)
        return True

    def _lose(self, key: bytes) -> None:
        """``key`` and every indexed descendant become unreachable."""
        stack = [key]
        while stack:
            node = stack.pop()
            if node in self._sizes and node not in self._lost:
                self._lost[node] = None
                stack += self._children.get(node, ())

    def _revive(self, key: bytes) -> None:
        """``key`` is reachable: so are its unreachable descendants held in the index."""
        stack = list(self._children.get(key, ()))
        while stack:
            node = stack.pop()
            if node in self._lost:
                del self._lost[node]
                stack += self._children.get(node, ())

    def _would_evict(self, nbytes: int) -> list[bytes]:
        """The victims ``_evict_for(nbytes)`` would pop, without popping them (approximately:
        chunks that a victim's eviction makes unreachable are not counted in)."""
        assert self.max_bytes is not None
        excess = self._indexed + self._reserved + nbytes - self.max_bytes
        victims: list[bytes] = []
        reachable = (k for k in self._sizes if k not in self._lost)
        for key in itertools.chain(self._lost, reachable):
            if excess <= 0:
                break
            excess -= self._sizes[key]
            victims.append(key)
        return victims

    def _forget_over(self) -> None:
        """Past ``max_chunks``, drop the coldest entries (unreachable first), deleting nothing."""
        while self.max_chunks is not None and len(self._sizes) > self.max_chunks:
            self._remove(next(iter(self._lost)) if self._lost else next(iter(self._sizes)))
            self._forgotten += 1

    def _evict_for(self, nbytes: int) -> list[ChunkKey] | None:
        """Pop victims until ``nbytes`` more fit; ``None`` (nothing popped) if they cannot."""
        if self.max_bytes is None:
            return []
        excess = self._indexed + self._reserved + nbytes - self.max_bytes
        if excess > self._indexed:
            return None
        victims: list[ChunkKey] = []
        while excess > 0:
            key = next(iter(self._lost)) if self._lost else next(iter(self._sizes))
            excess -= self._sizes[key]
            self._remove(key)
            self._drops.note(key, deleting=True)  # the caller deletes it, then ``deleted``
            victims.append(key if isinstance(key, ChunkKey) else ChunkKey(key))
        return victims


def _prefix_order(found: list[Found]) -> list[Found]:
    """``found`` (least recently used first) reordered so that no chunk comes after one of
    its descendants: each chunk takes the latest use of its subtree, ties put deeper first."""
    position: dict[bytes, int] = {key: i for i, (key, _, _) in enumerate(found)}
    latest = list(range(len(found)))
    height = [0] * len(found)
    for i in range(len(found) - 1, -1, -1):  # newest first: a parent is later in the loop
        parent = found[i][2]
        j = position.get(parent) if parent is not None else None
        if j is not None and j < i and (latest[i], height[i] + 1) > (latest[j], height[j]):
            latest[j], height[j] = latest[i], height[i] + 1
    order = sorted(range(len(found)), key=lambda i: (latest[i], height[i]))
    return [found[i] for i in order]
