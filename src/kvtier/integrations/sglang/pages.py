"""PageStore: SGLang's pages across the runtime's tiers (lookups, loads and stores).

A page is ``shape.spans`` chunks, one per span (``identity.span_key``). A tier holds a page
when it holds every one of its chunks; tiers are asked in configured order, switched-off ones
skipped (their lookups counted as ``disabled``).

* ``exists``: the leading pages some tier holds, from the tiers' indexes (``lookup``: no I/O
  here). A tier's ``RETRY`` (it is still probing) ends the prefix there, as a miss does.
* ``load``: the leading held pages are read into SGLang's host pages, each from the tier that
  holds it; a page is served only when every chunk was verified (the tier's ``succeeded``); the
  answer is a prefix (``True`` up to the first page that failed).
* ``store``: every enabled tier that takes stores is written the chunks it does not already
  hold and its admission keeps (an existing page is a success, so is one admission, a
  switched-off tier or a tier taking no stores skips: the job is done, a later lookup misses);
  a page fails only when a chunk of it failed to be written. Each chunk is written atomically
  by its tier, and a page counts as held only with all its chunks, so a half-written page is
  never a hit.

Thread safety: SGLang's prefetch (``exists``), load and backup threads call at once. Lookups
and submissions run under the runtime's lock; ``JobWaiter`` waits with it released.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.core.runtime import Runtime
from kvtier.core.tier_set import Finished
from kvtier.integrations.common.keymap import KeyMap
from kvtier.integrations.sglang.events import PageEvents
from kvtier.integrations.sglang.identity import PoolShape, page_of, span_key
from kvtier.integrations.sglang.spans import SpanRegion
from kvtier.integrations.sglang.waiter import Job, JobWaiter
from kvtier.keys import ChunkKey
from kvtier.policies.priority import DEFAULT_PRIORITY
from kvtier.tiers import base as kv

Pages = list[list[ChunkKey]]  # each page's chunk keys, span order


class PageStore:
    """Pages in the runtime's tiers (see the module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        region: SpanRegion,
        keys: KeyMap,
        shape: PoolShape,
        events: PageEvents | None = None,
    ) -> None:
        self._runtime, self._region, self._keys, self._shape = runtime, region, keys, shape
        self._events = events
        self.waiter = JobWaiter(runtime, self._removed)

    # -- lookups ---------------------------------------------------------------------------
    def exists(self, page_keys: Sequence[str]) -> int:
        """How many leading pages of ``page_keys`` some enabled tier holds."""
        with self._runtime.lock:
            pages = self._chunks(page_keys)
            return len(self._holders(pages))

    def _chunks(self, page_keys: Sequence[str]) -> Pages:
        spans = range(self._shape.spans)
        return [[self._keys.chunk_key(span_key(k, s)) for s in spans] for k in page_keys]

    def _holders(self, pages: Pages) -> list[int]:
        """The tier to read each leading held page from (under the lock)."""
        holders: list[int] = []
        for chunks in pages:
            holder = self._holder(chunks)
            if holder is None:
                break
            holders.append(holder)
        return holders

    def _holder(self, chunks: list[ChunkKey]) -> int | None:
        tiers = self._runtime.tiers
        for index in range(len(tiers)):
            if not tiers.enabled(index):
                self._runtime.metrics.count(
                    "tier_lookups", tier=tiers[index].name, result="disabled"
                )
                continue
            answers = [tiers.lookup(index, c) for c in chunks]  # every span: probed at once
            if all(answer is kv.HIT for answer in answers):
                return index
        return None

    # -- loads -----------------------------------------------------------------------------
    def load(
        self, page_keys: Sequence[str], pointers: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        """Read the leading held pages into the spans at ``pointers``; a prefix of successes."""
        with self._runtime.lock:
            pages = self._chunks(page_keys)
            holders = self._holders(pages)
        found = len(holders)
        spans = self._shape.spans
        slots = self._region.lend(pointers[: found * spans], sizes[: found * spans])
        try:
            jobs = self._jobs("load", pages[:found], holders, slots)
            done = self._succeeded(self.waiter.run(jobs))
        finally:
            self._region.give_back(slots)
        served = _prefix([all(c in done for c in chunks) for chunks in pages[:found]])
        self._count_served(holders[: sum(served)])
        return served + [False] * (len(page_keys) - len(served))

    def _jobs(self, op: kv.Op, pages: Pages, tiers: list[int], slots: list[int]) -> list[Job]:
        """One job per tier for ``pages`` (``tiers[i]`` moves page ``i``), slot order."""
        spans, by_tier = self._shape.spans, {}  # type: ignore[var-annotated]
        for i, (chunks, tier) in enumerate(zip(pages, tiers, strict=True)):
            keys, own = by_tier.setdefault(tier, ([], []))
            keys += chunks
            own += slots[i * spans : (i + 1) * spans]
        return [Job(tier, op, keys, own) for tier, (keys, own) in by_tier.items()]

    @staticmethod
    def _succeeded(finished: list[Finished]) -> set[ChunkKey]:
        return {key for job in finished for key in job.succeeded}

    def _count_served(self, holders: list[int]) -> None:
        page_size, tiers = self._shape.page_size, self._runtime.tiers
        for index in set(holders):
            tokens = holders.count(index) * page_size
            self._runtime.metrics.count("prompt_tokens", tokens, source=tiers[index].name)

    # -- stores ----------------------------------------------------------------------------
    def store(
        self, page_keys: Sequence[str], pointers: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        """Write the pages at ``pointers`` to every enabled tier; per page, whether it is held
        (or deliberately skipped) afterwards."""
        slots = self._region.lend(pointers, sizes)
        try:
            with self._runtime.lock:
                pages = self._chunks(page_keys)
                jobs = self._store_jobs(pages, slots)
            finished = self.waiter.run(jobs)
        finally:
            self._region.give_back(slots)
        failed = {key for job in finished for key in job.failed}
        ok = [not failed.intersection(chunks) for chunks in pages]
        self._note_stored(page_keys, pages, finished)
        return ok

    def _store_jobs(self, pages: Pages, slots: list[int]) -> list[Job]:
        slot_of = dict(zip((c for chunks in pages for c in chunks), slots, strict=True))
        jobs = []
        for index, tier in enumerate(self._runtime.tiers):
            if not getattr(tier, "accepts_stores", True):
                continue
            wanted = self._wanted(index, pages)
            if wanted:
                jobs.append(Job(index, "store", wanted, [slot_of[c] for c in wanted]))
        return jobs

    def _wanted(self, index: int, pages: Pages) -> list[ChunkKey]:
        """The chunks tier ``index`` should be written: not held, admitted (under the lock)."""
        runtime, name = self._runtime, self._runtime.tiers[index].name
        chunks = [c for page in pages for c in page]
        if not runtime.tiers.enabled(index):
            runtime.metrics.count(
                "admission_dropped", len(chunks), tier=name, reason="tier_disabled"
            )
            return []
        missing = [c for c in chunks if runtime.tiers.lookup(index, c) is not kv.HIT]
        if not missing or not runtime.admission.active:
            return missing
        runtime.note_offer(missing, id(pages))
        offer = runtime.admission.offer(missing, len(pages), [DEFAULT_PRIORITY] * len(missing))
        kept = set(runtime.admission.admit(name, offer))
        return [c for c in missing if c in kept]

    def _note_stored(
        self, page_keys: Sequence[str], pages: Pages, finished: list[Finished]
    ) -> None:
        if self._events is None:
            return
        for job in finished:
            written = set(job.succeeded)
            name = self._runtime.tiers[job.job.tier].name
            keys = [
                k for k, chunks in zip(page_keys, pages, strict=True) if written.issuperset(chunks)
            ]
            self._events.stored(keys, name)

    def _removed(self, index: int, removed: list[ChunkKey]) -> None:
        """A tier evicted ``removed``: one ``BlockRemoved`` for their pages (under the lock)."""
        if self._events is None:
            return
        spans = [self._keys.offload_key(c) for c in removed]
        pages = list(dict.fromkeys(page_of(s) for s in spans if s is not None))
        self._events.removed(pages, self._runtime.tiers[index].name)


def _prefix(flags: list[bool]) -> list[bool]:
    """``flags`` up to the first ``False``, and ``False`` from there on."""
    first = flags.index(False) if False in flags else len(flags)
    return [True] * first + [False] * (len(flags) - first)
