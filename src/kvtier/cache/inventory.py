"""``kvtier cache ls`` and ``du``: what each identity holds, in lines or JSON.

``ls`` lists chunk files or objects with their sizes and times only; ``du`` also reads each
chunk's link (``LINK_BYTES`` of its header) to count *unreachable* chunks: those whose link
names a parent the same namespace does not hold, which no prefix lookup can reach
(``kvtier.tiers.shared.lineage``). Times are last use where the tier refreshes them (fs: a
read refreshes a chunk's mtime), else the time of the last write (S3: ``LastModified``).

Thread safety: plain functions, on the caller's thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kvtier.cache.identity_doc import IdentityInfo
from kvtier.cache.records import Problems, Usage, one_line
from kvtier.cache.store import Store


@dataclass
class Entry:
    """One identity: its digest (hex), what identity.json says, and its usage."""

    digest: str
    info: IdentityInfo
    usage: Usage


def take_inventory(store: Store[Any], problems: Problems, *, links: bool) -> list[Entry]:
    """One ``Entry`` per namespace, largest first; ``links``: count unreachable chunks."""
    entries = [
        Entry(ns.digest, ns.info, store.usage(ns, problems, links=links))
        for ns in store.namespaces(problems)
    ]
    return sorted(entries, key=lambda e: (-e.usage.bytes, e.digest))


def total(entries: list[Entry]) -> Usage:
    """The sum of every entry's usage (unreachable chunks unknown where one entry's are)."""
    whole = Usage()
    for entry in entries:
        whole.merge(entry.usage)
    if any(entry.usage.unreachable is None for entry in entries):
        whole.unreachable = None
    return whole


def when(stamp: float | None) -> str:
    """A time as ``2026-12-02 12:56`` UTC; ``-`` for none."""
    return "-" if stamp is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(stamp))


def size(nbytes: int) -> str:
    """Bytes in binary units, three significant figures (``1.50 GiB``)."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def ls_lines(entries: list[Entry]) -> list[str]:
    """The ``ls`` table: one line per identity, a header first."""
    rows = [["DIGEST", "MODEL", "REVISION", "DTYPE", "LAYOUT", "TOKENS", "CHUNKS", "BYTES"]]
    rows[0] += ["OLDEST USE (UTC)", "NEWEST USE (UTC)"]
    for e in entries:
        tokens = "?" if e.info.tokens_per_chunk is None else str(e.info.tokens_per_chunk)
        named = [e.digest[:12], e.info.model, e.info.revision, e.info.dtype, e.info.layout_digest]
        held = [tokens, str(e.usage.chunks), size(e.usage.bytes)]
        rows.append([*named, *held, when(e.usage.oldest), when(e.usage.newest)])
    return _table(rows)


def du_lines(entries: list[Entry]) -> list[str]:
    """The ``du`` table: per identity, then the total."""
    rows = [["DIGEST", "MODEL", "CHUNKS", "PAYLOAD+HEADERS", "ON DISK", "UNREACHABLE"]]
    for e in [*entries, Entry("total", IdentityInfo(model=""), total(entries))]:
        unreachable = "?" if e.usage.unreachable is None else str(e.usage.unreachable)
        sizes = [size(e.usage.bytes), size(e.usage.disk_bytes)]
        rows.append([e.digest[:12], e.info.model, str(e.usage.chunks), *sizes, unreachable])
    return _table(rows)


def as_json(target: str, entries: list[Entry], problems: Problems) -> dict[str, Any]:
    """``ls --json`` and ``du --json``: every identity, the total and the problem counters."""
    return {
        "target": target,
        "identities": [_entry_json(e) for e in entries],
        "total": _usage_json(total(entries)),
        "problems": dict(sorted(problems.counts.items())),
    }


def _entry_json(entry: Entry) -> dict[str, Any]:
    doc: dict[str, Any] = {"digest": entry.digest, **entry.info.as_dict()}
    if entry.info.problem is not None:
        doc["identity_problem"] = entry.info.problem
    return {**doc, **_usage_json(entry.usage)}


def _usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "chunks": usage.chunks,
        "bytes": usage.bytes,
        "disk_bytes": usage.disk_bytes,
        "unreachable": usage.unreachable,
        "oldest_use": usage.oldest,
        "newest_use": usage.newest,
    }


def _table(rows: list[list[str]]) -> list[str]:
    """``rows`` as aligned columns; control characters (from identity.json, which anyone who
    can write the cache writes) escaped, so every row is one line and none drives the terminal."""
    rows = [[one_line(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return [line.rstrip() for line in lines]
