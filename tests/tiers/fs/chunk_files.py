"""Where an fs tier's chunk file lies, and dropping it from the page cache (a cold read)."""

from __future__ import annotations

import os
from pathlib import Path

from kvtier.keys import ChunkKey
from kvtier.tiers.fs.tier import FilesystemTier


def chunk_file(tier: FilesystemTier, key: ChunkKey) -> Path:
    name = key.hex()
    return Path(tier.namespace) / name[:2] / name[2:4] / name


def drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
