"""The obj tier's layout in a bucket, walked for ``kvtier cache``.

Layout (``kvtier.tiers.s3.tier``): ``<prefix>/<64 hex digest>/identity.json`` and
``<prefix>/<digest>/<64 hex key>`` chunk objects (codec header block, then payload). Only
objects with those names are kvtier's; anything else under the prefix (a deeper name, another
name, an object right under the prefix) is *foreign*: counted, named in a line, never read as a
chunk and never deleted.

Namespaces are found with one delimited listing of the prefix; each namespace's objects are
listed in pages (``PAGE``), so a listing holds one page at a time. Times are ``LastModified``:
the obj tier does not rewrite an object when it reads it, so for a bucket "use" is the last
write. ``du`` and ``gc`` read each chunk's link with a ranged GET of ``LINK_BYTES`` (one
request per chunk, ``LINK_READERS`` at a time). Requests go through the tier's own client
(``ObjectClient``: its endpoint, credentials, timeouts and error messages).

Thread safety: the client is shared by threads; ``S3Store`` is walked on one thread, ``read``
and the ``remove_*`` methods may run on any.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import obstore

from kvtier.cache.fs_store import TargetError
from kvtier.cache.identity_doc import IdentityInfo, parse_identity, problem_kind
from kvtier.cache.records import Problems, Usage
from kvtier.cache.store import Chunk, ChunkRead, Scratch
from kvtier.errors import TierError
from kvtier.tiers.s3.client import ObjectClient, ObjectRefused
from kvtier.tiers.s3.config import ObjTierConfig
from kvtier.tiers.shared import codec
from kvtier.tiers.shared.lineage import LINK_BYTES, LINK_OFFSET, read_link

PAGE = 1000
LINK_READERS = 16
_KEY = re.compile(r"[0-9a-f]{64}")
_NO_PARENT = bytes(32)
#: A page of a namespace's chunk objects: key hex, size, last modified.
Page = list[tuple[str, int, float]]


@dataclass
class S3Namespace:
    """One identity's objects under ``prefix`` (``<prefix>/<digest>``)."""

    digest: str
    prefix: str
    info: IdentityInfo


class _Client(ObjectClient):
    """The tier's client, with the listing and ranged reads the cache commands need."""

    def pages(self, prefix: str) -> Iterator[list[tuple[str, int, float]]]:
        """The objects under ``prefix``, a page at a time. S3 lists names in increasing order:
        a name that does not sort after the one before it (a store that repeats its pages)
        ends the listing with a ``TierError`` instead of a listing without end."""
        stream = self._call(obstore.list, self._store, prefix, chunk_size=PAGE)
        pages, last = iter(stream), ""
        while (page := self._call(next, pages, None)) is not None:
            rows = [(m["path"], int(m["size"]), m["last_modified"].timestamp()) for m in page]
            for name, _, _ in rows:
                if name <= last:
                    raise TierError(f"the listing went back to {name!r} after {last!r}")
                last = name
            yield rows

    def delimited(self, prefix: str) -> tuple[list[str], list[str]]:
        """Common prefixes and object names right under ``prefix``."""
        result = self._call(obstore.list_with_delimiter, self._store, prefix)
        objects = [m["path"] for m in result["objects"]]
        return [p.rstrip("/") for p in result["common_prefixes"]], objects

    def read_range(self, name: str, start: int, end: int) -> bytes | None:
        data = self._call(obstore.get_range, self._store, name, start=start, end=end)
        return None if data is None else bytes(data)

    def read_all(self, name: str, limit: int) -> bytes | None:
        """Object ``name``, cut at ``limit`` bytes: the body is read only that far (anyone
        who can write the bucket chooses its size); ``None`` when there is none."""
        result = self._call(obstore.get, self._store, name)
        if result is None:
            return None
        head: bytes = self._call(_head_of, result.stream(min_chunk_size=0), limit)
        return head

    def remove(self, name: str) -> bool:
        try:
            self._call(obstore.delete, self._store, name)
        except TierError:
            return False
        return True


def _head_of(pieces: Iterable[Any], limit: int) -> bytes:
    """The first ``limit`` bytes of a body arriving in ``pieces``; the rest is not read."""
    got = bytearray()
    for piece in pieces:
        got += memoryview(piece)[: limit - len(got)]
        if len(got) >= limit:
            break
    return bytes(got)


class S3Store:
    """The kvtier objects under ``config.prefix`` in ``config.bucket``; ``TargetError`` when
    the bucket cannot be reached or refuses the credentials."""

    kind = "s3"

    def __init__(self, config: ObjTierConfig) -> None:
        self._bucket = config.bucket
        self._prefix = config.prefix.strip("/")
        try:
            self._client = _Client(config)
            self._client.check_bucket(self._prefix)
        except (ObjectRefused, TierError) as exc:
            raise TargetError(f"s3://{config.bucket}/{self._prefix}: {exc}") from None

    def close(self) -> None:
        """Nothing to release (the client's connections go with it)."""

    def path(self, ns: S3Namespace, name: str = "") -> str:
        return f"s3://{self._bucket}/{ns.prefix}" + (f"/{name}" if name else "")

    def namespaces(self, problems: Problems) -> list[S3Namespace]:
        """Every ``<prefix>/<digest>`` with its identity.json read."""
        base = f"{self._prefix}/" if self._prefix else ""
        prefixes, objects = self._client.delimited(self._prefix)
        for name in objects:
            problems.note("foreign", f"s3://{self._bucket}/{name}", "not kvtier's; left alone")
        found = []
        for prefix in prefixes:
            digest = prefix[len(base) :]
            if _KEY.fullmatch(digest):
                found.append(S3Namespace(digest, prefix, self._identity(prefix, problems)))
            else:
                where = f"s3://{self._bucket}/{prefix}/"
                problems.note("foreign", where, "not kvtier's; left alone")
        return sorted(found, key=lambda ns: ns.digest)

    def _identity(self, prefix: str, problems: Problems) -> IdentityInfo:
        name = f"{prefix}/identity.json"
        try:
            info = parse_identity(self._client.read_all(name, (1 << 20) + 1))
        except TierError as exc:
            info = IdentityInfo(problem=f"identity.json: {exc}")
        if info.problem is not None:
            problems.note(problem_kind(info), f"s3://{self._bucket}/{name}", info.problem)
        return info

    def _objects(self, ns: S3Namespace, problems: Problems) -> Iterator[Page]:
        """Pages of ``ns``'s chunk objects as (key hex, size, time); the rest counted."""
        start = len(ns.prefix) + 1
        for page in self._client.pages(f"{ns.prefix}/"):
            chunks = []
            for name, nbytes, when in page:
                rest = name[start:]
                if _KEY.fullmatch(rest):
                    chunks.append((rest, nbytes, when))
                elif rest != "identity.json":
                    where = f"s3://{self._bucket}/{name}"
                    problems.note("foreign", where, "not kvtier's; left alone")
            yield chunks

    def usage(self, ns: S3Namespace, problems: Problems, *, links: bool) -> Usage:
        """As ``FsStore.usage``."""
        usage, watch = Usage(), problems.watch()
        for page in self._objects(ns, problems):
            for _, nbytes, when in page:
                usage.chunks += 1
                usage.bytes += nbytes
                usage.disk_bytes += nbytes
                usage.add_times(when, when)
            if links:
                for name, parent in zip(page, self._parents(ns, page, problems), strict=True):
                    usage.keys += bytes.fromhex(name[0])
                    usage.parents += parent or _NO_PARENT
        if links:
            usage.settle_links(complete=not watch.failed)
        return usage

    def chunks(self, ns: S3Namespace, problems: Problems) -> Iterator[Chunk]:
        for page in self._objects(ns, problems):
            parents = self._parents(ns, page, problems)
            for (name, nbytes, when), parent in zip(page, parents, strict=True):
                yield name, nbytes, when, parent

    def names(self, ns: S3Namespace, problems: Problems) -> Iterator[tuple[str, int]]:
        for page in self._objects(ns, problems):
            yield from ((name, nbytes) for name, nbytes, _ in page)

    def _parents(self, ns: S3Namespace, page: Page, problems: Problems) -> list[bytes | None]:
        def parent(name: str) -> bytes | None:
            try:
                where = f"{ns.prefix}/{name}"
                raw = self._client.read_range(where, LINK_OFFSET, LINK_OFFSET + LINK_BYTES)
            except TierError as exc:
                problems.note("unreadable", self.path(ns, name), str(exc))
                return None
            link = read_link(raw) if raw else None
            return link.parent if link is not None else None

        with ThreadPoolExecutor(LINK_READERS) as pool:
            return list(pool.map(parent, [name for name, _, _ in page]))

    def read(self, ns: S3Namespace, name: str, size: int, scratch: Scratch) -> ChunkRead | None:
        """Object ``name`` (listed at ``size`` bytes) into ``scratch``; ``None`` when gone;
        ``IntegrityError`` (``length``) when it grew past its listed size."""
        view = scratch.view(max(size, codec.HEADER_BYTES))
        head, body = view[: codec.HEADER_BYTES], view[codec.HEADER_BYTES :]
        got = self._client.get_into(f"{ns.prefix}/{name}", (head, body))
        if got is None:
            return None
        payload = view[codec.HEADER_BYTES : max(got, codec.HEADER_BYTES)]
        return ChunkRead(view[: min(got, codec.HEADER_BYTES)], payload, None, None)

    def remove_bad(self, ns: S3Namespace, name: str, seen: object) -> bool:
        assert _KEY.fullmatch(name), name  # only ever a chunk object of the layout
        return self._client.remove(f"{ns.prefix}/{name}")

    def remove_cold(self, ns: S3Namespace, name: str, mtime: float) -> bool:
        """Delete chunk object ``name`` (its ``LastModified`` does not move on reads, so a
        server's use since the listing is not seen: a server then misses it once)."""
        assert _KEY.fullmatch(name), name
        return self._client.remove(f"{ns.prefix}/{name}")

    def temporaries(self, ns: S3Namespace) -> Iterator[tuple[str, int, float]]:
        """None: a put is never visible before it is whole."""
        return iter(())

    def remove_temporary(self, ns: S3Namespace, name: str, mtime: float) -> bool:
        return False
