"""The ``ab/cd`` directories of the fs layout as arrays of chunk records, for ``kvtier cache``.

``tree_records`` lists an ``ab`` directory and every ``ab/cd`` below it with each chunk
file's ``lstat`` and, when asked, its link (``kvtier.tiers.shared.lineage``) as
``native.CHUNK_RECORD`` rows: through the compiled ``scan_chunks`` where it is built (one call
per ``ab``, the GIL released once, so that threads list in parallel: what keeps ``du`` of a
million files near ten seconds), else through the ``os`` module into the same rows. Either
way the other entries are classified the same: a chunk name that is not a regular file is
``not_regular``, a write in progress ``in_progress``, the rest ``foreign``; nothing is
followed and nothing is opened that could block.

Thread safety: plain functions.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

import numpy as np

from kvtier.cache.records import Problems
from kvtier.tiers.fs import native
from kvtier.tiers.fs.paths import NotRegularError, failure_reason, open_level_dir
from kvtier.tiers.fs.scan import read_file_link
from kvtier.tiers.shared.lineage import LINK_BYTES, encode_link, read_link

KEY_NAME = re.compile(r"[0-9a-f]{64}")
LEVEL_NAME = re.compile(r"[0-9a-f]{2}")
#: A write in progress beside its chunk: ``<key>.<writer>.tmp`` (``kvtier.tiers.fs.files``).
TEMPORARY_NAME = re.compile(r"[0-9a-f]{64}\.[^/]*\.tmp")
#: Threads listing ``ab`` directories at once (the compiled listing releases the GIL).
SCAN_THREADS = 4
_NO_PARENT = bytes(32)


@dataclass(frozen=True)
class Found:
    """What one listing met besides chunk files: counted ``problems``, and the names of the
    temporary files of writes (appended from the listing's threads)."""

    problems: Problems
    temporaries: list[str]


def tree_records(
    ns_fd: int,
    name: str,
    where: str,
    problems: Problems,
    *,
    links: bool,
    temporaries: list[str] | None = None,
) -> np.ndarray:
    """The chunk files of level directory ``name`` (an ``ab`` below the namespace open as
    ``ns_fd``, path ``where``) and of every ``ab/cd`` below it, as ``native.CHUNK_RECORD``
    rows; everything else is counted in ``problems``. The names of temporary files of writes
    (``in_progress``) are also appended to ``temporaries`` (for ``gc``)."""
    found = Found(problems, [] if temporaries is None else temporaries)
    fd = open_level(name, ns_fd, where, problems)
    if fd is None:
        return np.zeros(0, native.CHUNK_RECORD)
    try:
        listing = native.scan_chunks(fd, links, depth=1)
        if listing is None:
            return _tree_by_levels(fd, name, where, found, links)
    except OSError as exc:
        problems.note(failure_reason(exc), where, f"cannot list: {why(exc)}")
        return np.zeros(0, native.CHUNK_RECORD)
    finally:
        os.close(fd)
    return _tree_rows(listing, ns_fd, name, where, found, links)


def _tree_rows(
    listing: native.ChunkListing,
    ns_fd: int,
    name: str,
    where: str,
    found: Found,
    links: bool,
) -> np.ndarray:
    rows = [listing.chunks]
    for other, d_type in listing.others:
        sub, _, leaf = other.rpartition("/")
        if sub:
            _classify(leaf, d_type != _DT_REG, f"{where}/{sub}", name + sub, found)
        elif LEVEL_NAME.fullmatch(leaf):  # one the compiled listing could not enter
            rows.append(_retry_level(ns_fd, name, leaf, where, found, links))
        else:
            found.problems.note("foreign", f"{where}/{leaf}", "not kvtier's; left alone")
    return _own(np.concatenate(rows), where, name, found.problems)


def _retry_level(
    ns_fd: int, name: str, sub: str, where: str, found: Found, links: bool
) -> np.ndarray:
    """Level ``name/sub`` through the ``os`` module, which names what is wrong with it."""
    top = open_level(name, ns_fd, where, found.problems)
    if top is None:
        return np.zeros(0, native.CHUNK_RECORD)
    try:
        fd = open_level(sub, top, f"{where}/{sub}", found.problems)
        if fd is None:
            return np.zeros(0, native.CHUNK_RECORD)
        try:
            return _os_records(fd, f"{where}/{sub}", name + sub, found, links)
        finally:
            os.close(fd)
    finally:
        os.close(top)


def _tree_by_levels(fd: int, name: str, where: str, found: Found, links: bool) -> np.ndarray:
    rows = [np.zeros(0, native.CHUNK_RECORD)]
    for entry in entries_of(fd, where, found.problems):
        if not LEVEL_NAME.fullmatch(entry.name):
            found.problems.note("foreign", f"{where}/{entry.name}", "not kvtier's; left alone")
            continue
        child = open_level(entry.name, fd, f"{where}/{entry.name}", found.problems)
        if child is not None:
            try:
                prefix = name + entry.name
                rows.append(_os_records(child, f"{where}/{entry.name}", prefix, found, links))
            finally:
                os.close(child)
    return np.concatenate(rows)


def parents_of(records: np.ndarray) -> list[bytes | None]:
    """Each record's parent key (``None``: the head of its chain, or no readable link)."""
    return [
        _parent(bytes(raw)) if err == 0 else None
        for raw, err in zip(records["link"], records["link_err"], strict=True)
    ]


def parent_bytes(records: np.ndarray) -> bytes:
    """``parents_of`` as 32 bytes per record, zeros for ``None``."""
    return b"".join(p or _NO_PARENT for p in parents_of(records))


_DT_REG = 8


def _parent(raw: bytes) -> bytes | None:
    link = read_link(raw)
    return link.parent if link is not None else None


def _own(records: np.ndarray, where: str, prefix: str, problems: Problems) -> np.ndarray:
    """The records under their own ``ab/cd``; a key elsewhere is foreign."""
    keys = np.ascontiguousarray(records["key"]).view(np.uint8).reshape(-1, 32)
    want = bytes.fromhex(prefix)
    second = want[1] if len(want) > 1 else records["level"]
    mine = (keys[:, 0] == want[0]) & (keys[:, 1] == second)
    for record in records[~mine]:
        name = bytes(record["key"]).hex()
        problems.note("foreign", f"{where}/{name}", "not kvtier's; left alone")
    own: np.ndarray = records[mine]
    return own


def _classify(name: str, odd: bool, where: str, prefix: str, found: Found) -> None:
    if len(name) == 64 and name.startswith(prefix) and KEY_NAME.fullmatch(name) and odd:
        found.problems.note("not_regular", f"{where}/{name}", "not a regular file; skipped")
    elif TEMPORARY_NAME.fullmatch(name) and name.startswith(prefix):
        found.problems.add("in_progress", 1)
        found.temporaries.append(name)
    else:
        found.problems.note("foreign", f"{where}/{name}", "not kvtier's; left alone")


def _os_records(fd: int, where: str, prefix: str, found: Found, links: bool) -> np.ndarray:
    """One ``ab/cd`` directory's rows through the ``os`` module (no compiled path here)."""
    rows = []
    try:
        with os.scandir(fd) as it:
            entries = list(it)
    except OSError as exc:
        found.problems.note(failure_reason(exc), where, f"cannot list: {exc.strerror or exc}")
        entries = []
    for entry in entries:
        row = _os_row(fd, entry, links) if KEY_NAME.fullmatch(entry.name) else None
        if row is None:
            _classify(entry.name, True, where, prefix, found)
        elif row is not False:
            rows.append(row)
    return _own(np.array(rows, dtype=native.CHUNK_RECORD), where, prefix, found.problems)


def _os_row(fd: int, entry: os.DirEntry[str], links: bool) -> tuple[object, ...] | bool | None:
    """A record of chunk file ``entry``; ``None`` when it is not a regular file, ``False``
    when it vanished meanwhile."""
    try:
        found = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    if not stat.S_ISREG(found.st_mode):
        return None
    raw, err = bytes(LINK_BYTES), 0
    if links:
        try:
            link = read_file_link(fd, entry.name)
            raw = encode_link(link) if link is not None else raw
        except OSError as exc:
            err = exc.errno or 1
    key = bytes.fromhex(entry.name)
    return (key, found.st_size, found.st_blocks * 512, found.st_mtime, err, key[1], raw, bytes(8))


def entries_of(fd: int, where: str, problems: Problems) -> list[os.DirEntry[str]]:
    """The entries of directory ``fd``; none (counted, with a line) when it cannot be listed."""
    try:
        with os.scandir(fd) as it:
            return list(it)
    except FileNotFoundError:
        return []
    except OSError as exc:
        problems.note(failure_reason(exc), where, f"cannot list: {why(exc)}")
        return []


def open_level(name: str, fd: int, where: str, problems: Problems) -> int | None:
    try:
        return open_level_dir(name, fd)
    except FileNotFoundError:
        return None
    except NotRegularError:
        problems.note("not_regular", where, "a link or not a directory; not followed")
    except OSError as exc:
        problems.note(failure_reason(exc), where, f"cannot open: {why(exc)}")
    return None


def why(exc: OSError) -> str:
    return exc.strerror or str(exc)
