"""``clear()`` of SGLang's admin route: delete this identity's chunks, nothing else.

SGLang's own ``file`` backend empties its whole directory. kvtier's shared directories and
buckets hold other models and other ranks (other identities) and possibly foreign files, so
``clear`` purges exactly this identity's namespace in every ``fs`` and ``obj`` tier, with the
same code as ``kvtier cache gc --identity DIGEST`` (``kvtier.cache.gc``: it deletes only
chunk files or objects of kvtier's layout). Peer tiers hold other instances' memory: untouched.
A running tier whose index still names a deleted chunk reads a miss (verification fails).

Thread safety: runs on SGLang's scheduler thread; the tiers may read and write meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from kvtier.cache.fs_store import FsStore
from kvtier.cache.gc import GcOptions, collect_garbage
from kvtier.cache.records import Problems
from kvtier.cache.store import Store
from kvtier.identity import CacheIdentity
from kvtier.tiers.base import TierConfig


def clear_namespace(tiers: Sequence[TierConfig], identity: CacheIdentity) -> bool:
    """Purge ``identity``'s chunks from every fs and obj tier of ``tiers``; ``True`` when each
    of this identity's chunks listed was deleted or was gone already (foreign entries and other
    identities' problems do not count)."""
    clean = True
    for config in tiers:
        store = _store_of(config)
        if store is None:
            continue
        try:
            options = GcOptions(identity=identity.hexdigest)
            report = collect_garbage(store, Problems(), options, time.time())
            clean = clean and report.deleted + report.skipped >= report.chosen["purge"]
        finally:
            store.close()
    return clean


def _store_of(config: Any) -> Store[Any] | None:
    if config.type_name == "fs":
        return FsStore(config.root_dir)
    if config.type_name == "obj":
        from kvtier.cache.s3_store import S3Store

        return S3Store(config)
    return None
