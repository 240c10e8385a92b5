"""``kvtier cache gc``: delete chunks to bound, expire or purge what a shared cache holds.

One round (``collect_garbage``) lists every namespace and decides victims in this order:

1. ``identity``/``model``: every chunk of the chosen identities (a purge; a digest prefix
   that starts more than one identity deletes nothing: ``AmbiguousIdentity``);
2. ``older_than``: chunks last used before ``now - older_than``;
3. ``max_bytes``: what is left, across every identity, goes through one ``ChunkIndex``
   (``kvtier.tiers.shared.chunk_index``, the eviction rule the tiers use): fed oldest use
   first, unreachable chunks go first, then least recently used, a prefix cut from its tail
   and never its head, until the total is at most ``max_bytes``.

Besides chunks, a round removes the temporary files of writes that were never finished (a
writer that crashed) once they are ``STALE_TMP_S`` old, the age after which the fs tier's own
start-up scan takes them for stale whoever wrote them: without gc, those of an identity no
server runs any more stayed for ever.

Chunks of different namespaces never link to each other: the index keys are the namespace's
number followed by the chunk key. Deletion is the store's ``remove_cold``: the exact chunk
file (or object), skipped when its use time moved since the listing (a server used it: it is
not cold any more). A server that loses a chunk sees a miss. Nothing outside the layout is
ever deleted: victims come only from the stores' chunk listings. ``dry_run`` decides and
reports, and deletes nothing.

Memory: the index holds every chunk left after 1 and 2 (about 0.5 KB each in Python objects).
Thread safety: one round runs on the caller's thread; ``stop`` (set by a signal handler) ends
it between deletions.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kvtier.cache.records import Problems
from kvtier.cache.store import Chunk, Store
from kvtier.errors import KVTierError
from kvtier.keys import ChunkKey
from kvtier.tiers.fs.scan import STALE_TMP_S
from kvtier.tiers.shared.chunk_index import ChunkIndex


class AmbiguousIdentity(KVTierError):
    """``--identity`` is a prefix of more than one identity's digest."""


@dataclass(frozen=True)
class GcOptions:
    """What one round deletes; ``identity`` is a digest prefix, ``model`` a model name."""

    max_bytes: int | None = None
    older_than: float | None = None
    identity: str | None = None
    model: str | None = None
    dry_run: bool = False


@dataclass
class GcReport:
    """Chunks and bytes found, victims by why (``purge``, ``age``, ``bound``), what was deleted,
    skipped (used since listed, or already gone) and what is left."""

    chunks: int = 0
    bytes: int = 0
    chosen: Counter[str] = field(default_factory=Counter)
    chosen_bytes: int = 0
    unreachable_first: int = 0
    deleted: int = 0
    deleted_bytes: int = 0
    skipped: int = 0
    temporaries: int = 0  # stale temporary files found (removed unless a dry run)
    temporaries_bytes: int = 0

    @property
    def left_bytes(self) -> int:
        return self.bytes - self.deleted_bytes


@dataclass(frozen=True)
class _Victim:
    ns: Any
    name: str
    size: int
    mtime: float
    why: str


def collect_garbage(
    store: Store[Any],
    problems: Problems,
    options: GcOptions,
    now: float,
    stop: threading.Event | None = None,
) -> GcReport:
    """One round over ``store`` at time ``now``; see the module docstring."""
    report = GcReport()
    namespaces = store.namespaces(problems)
    purged = _purged(namespaces, options)
    victims = [
        _Victim(ns, name, nbytes, mtime, "purge")
        for ns in purged
        for name, nbytes, mtime, _ in _listed(store, ns, problems, report)
    ]
    kept = [ns for ns in namespaces if ns not in purged]
    victims += _by_age_and_bound(store, kept, problems, options, now, report)
    for victim in victims:
        report.chosen[victim.why] += 1
        report.chosen_bytes += victim.size
    stale = [
        (ns, name, nbytes, mtime)
        for ns in namespaces
        for name, nbytes, mtime in store.temporaries(ns)
        if mtime < now - STALE_TMP_S
    ]
    if not options.dry_run:
        _delete(store, victims, report, stop)
    _remove_temporaries(store, stale, report, options.dry_run, stop)
    return report


def _remove_temporaries(
    store: Store[Any],
    stale: list[tuple[Any, str, int, float]],
    report: GcReport,
    dry_run: bool,
    stop: threading.Event | None,
) -> None:
    for ns, name, nbytes, mtime in stale:
        if stop is not None and stop.is_set():
            return
        if dry_run or store.remove_temporary(ns, name, mtime):
            report.temporaries += 1
            report.temporaries_bytes += nbytes


def _purged(namespaces: list[Any], options: GcOptions) -> list[Any]:
    """The namespaces purged: the one whose digest starts with ``identity`` (never an empty
    prefix; ``AmbiguousIdentity`` when it starts more than one) and those whose identity.json
    names ``model`` (never a placeholder for an unknown model)."""
    prefix = (options.identity or "").lower()
    by_digest = [ns for ns in namespaces if prefix and ns.digest.startswith(prefix)]
    if len(by_digest) > 1:
        shown = ", ".join(ns.digest[:12] for ns in by_digest[:4])
        raise AmbiguousIdentity(
            f"--identity {prefix} starts {len(by_digest)} identities ({shown}...): "
            "give more digits; nothing deleted"
        )
    model = options.model
    return [ns for ns in namespaces if ns in by_digest or (model and ns.info.names_model(model))]


def _listed(store: Store[Any], ns: Any, problems: Problems, report: GcReport) -> list[Chunk]:
    chunks = list(store.chunks(ns, problems))
    report.chunks += len(chunks)
    report.bytes += sum(c[1] for c in chunks)
    return chunks


def _linked(store: Store[Any], ns: Any, problems: Problems, report: GcReport) -> list[Chunk]:
    """``ns``'s chunks, without their parents when part of ``ns`` could not be listed (an
    errno counted meanwhile): a parent not seen may be there, so none is taken for
    unreachable (deleted first); the bound then takes them by last use."""
    watch = problems.watch()
    chunks = _listed(store, ns, problems, report)
    if not watch.failed:
        return chunks
    return [(name, nbytes, mtime, None) for name, nbytes, mtime, _ in chunks]


def _by_age_and_bound(
    store: Store[Any],
    namespaces: list[Any],
    problems: Problems,
    options: GcOptions,
    now: float,
    report: GcReport,
) -> list[_Victim]:
    cutoff = -math.inf if options.older_than is None else now - options.older_than
    victims: list[_Victim] = []
    found: list[tuple[float, bytes, int, bytes | None]] = []
    where: dict[bytes, tuple[Any, float, int]] = {}
    for number, ns in enumerate(namespaces):
        tag = number.to_bytes(4, "big")
        for name, nbytes, mtime, parent in _linked(store, ns, problems, report):
            if mtime < cutoff:
                victims.append(_Victim(ns, name, nbytes, mtime, "age"))
                continue
            key = tag + bytes.fromhex(name)
            found.append((mtime, key, nbytes, None if parent is None else tag + parent))
            if options.max_bytes is not None:
                where[key] = (ns, mtime, nbytes)
    if options.max_bytes is not None:
        victims += _over_bound(found, where, options.max_bytes, report)
    return victims


def _over_bound(
    found: list[tuple[float, bytes, int, bytes | None]],
    where: dict[bytes, tuple[Any, float, int]],
    max_bytes: int,
    report: GcReport,
) -> list[_Victim]:
    """Victims ``ChunkIndex`` picks to bring ``found`` (any order) within ``max_bytes``."""
    found.sort(key=lambda chunk: chunk[0])
    index = ChunkIndex(None)
    index.merge_cold((ChunkKey(key), nbytes, parent) for _, key, nbytes, parent in found)
    unreachable = index.unreachable_count()
    found.clear()
    index.max_bytes = max_bytes
    evicted = index.merge_cold(())
    report.unreachable_first = min(unreachable, len(evicted))
    victims = []
    for key in evicted:
        ns, mtime, nbytes = where[key]
        victims.append(_Victim(ns, key[4:].hex(), nbytes, mtime, "bound"))
    return victims


def _delete(
    store: Store[Any], victims: list[_Victim], report: GcReport, stop: threading.Event | None
) -> None:
    for victim in victims:
        if stop is not None and stop.is_set():
            return
        mtime = math.inf if victim.why == "purge" else victim.mtime
        if store.remove_cold(victim.ns, victim.name, mtime):
            report.deleted += 1
            report.deleted_bytes += victim.size
        else:
            report.skipped += 1
