"""Building real kvtier caches for the cache command tests: fs directories and S3 prefixes
laid out as the tiers lay them out, with chunk chains carrying their links."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from kvtier.identity import CacheIdentity
from kvtier.layout import KVLayout
from kvtier.tiers.fs.namespace import describe
from kvtier.tiers.shared import codec
from kvtier.tiers.shared.lineage import chain_links, linked

PAYLOAD = 8192


def make_identity(model: str, block_size: int = 16) -> CacheIdentity:
    layout = KVLayout(
        num_layers=2, num_kv_heads=2, head_dim=8, dtype="float16", block_size=block_size
    )
    return CacheIdentity(model=model, layout=layout)


def chain(identity: CacheIdentity, n: int, seed: int = 0) -> list[bytes]:
    """``n`` keys of one prefix (as kvtier's chained keys would be: distinct, deterministic)."""
    return [hashlib.sha256(f"{identity.hexdigest}/{seed}/{i}".encode()).digest() for i in range(n)]


def chunk_bytes(
    identity: CacheIdentity, key: bytes, parent: bytes | None, index: int, size: int = PAYLOAD
) -> bytes:
    payload = hashlib.sha256(key).digest() * (size // 32)
    header = codec.encode_header(identity.digest, key, payload)
    from kvtier.tiers.shared.lineage import Link

    return linked(header, Link(parent, index)) + payload


@dataclass
class FsCache:
    """An fs tier root under construction."""

    root: Path
    files: dict[bytes, Path] = field(default_factory=dict)

    def namespace(self, identity: CacheIdentity) -> Path:
        ns = self.root / identity.hexdigest
        ns.mkdir(parents=True, exist_ok=True)
        (ns / "identity.json").write_text(describe(identity))
        return ns

    def path(self, identity: CacheIdentity, key: bytes) -> Path:
        name = key.hex()
        return self.root / identity.hexdigest / name[:2] / name[2:4] / name

    def write_chain(
        self,
        identity: CacheIdentity,
        keys: list[bytes],
        mtime: float | None = None,
        size: int = PAYLOAD,
    ) -> list[Path]:
        """Write ``keys`` as one prefix; ``mtime``: their use time (head newest by a second each)."""
        self.namespace(identity)
        paths = []
        for i, link in enumerate(chain_links(keys)):
            path = self.path(identity, keys[i])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(chunk_bytes(identity, keys[i], link.parent, link.index, size))
            if mtime is not None:
                os.utime(path, (mtime - i, mtime - i))
            self.files[keys[i]] = path
            paths.append(path)
        return paths


def identity_doc(identity: CacheIdentity) -> bytes:
    return json.dumps(identity.describe(), indent=1, sort_keys=True).encode()
