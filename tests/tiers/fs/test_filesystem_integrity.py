"""Corrupt chunk files are detected, deleted and counted; the manager falls back to recompute.

Each scenario: a manager stores four chunks through to an ``fs`` tier and closes; one file is
damaged on disk; a new manager over the same directory serves chunk 0 from disk and stops at the
damaged chunk (recompute from there), never serving its bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kvtier import CacheIdentity, ChunkKey, TieringManager
from kvtier.config import FsTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs.tier import FilesystemTier
from kvtier.tiers.shared.codec import HEADER_BYTES
from tests.conftest import collect, config, fill, holds, make_keys, settle, store

#: Every test runs with the compiled chunk-file I/O and with the os-module path.
pytestmark = pytest.mark.usefixtures("fs_io")


def chunk_path(root: Path, identity: CacheIdentity, key: ChunkKey) -> Path:
    name = key.hex()
    return root / identity.hexdigest / name[:2] / name[2:4] / name


def flip_payload_byte(path: Path, **_: object) -> None:
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 123] ^= 0x01
    path.write_bytes(bytes(data))


def flip_header_byte(path: Path, **_: object) -> None:
    data = bytearray(path.read_bytes())
    data[60] ^= 0x80  # inside the stored key
    path.write_bytes(bytes(data))


def truncate(path: Path, **_: object) -> None:
    with open(path, "r+b") as file:
        file.truncate(HEADER_BYTES + 1000)


def truncate_into_header(path: Path, **_: object) -> None:
    with open(path, "r+b") as file:
        file.truncate(50)


def append_garbage(path: Path, **_: object) -> None:
    with open(path, "ab") as file:
        file.write(b"extra")


def swap_with_next(path: Path, *, next_path: Path, **_: object) -> None:
    data, other = path.read_bytes(), next_path.read_bytes()
    path.write_bytes(other)
    next_path.write_bytes(data)


def foreign_identity(path: Path, *, key: ChunkKey, identity: CacheIdentity, **_: object) -> None:
    """Overwrite with the same key stored by a cache of another identity."""
    stranger = CacheIdentity(model="other/model", layout=identity.layout)
    region = HostRegion(1, identity.layout.chunk_bytes)
    root = path.parent / "stranger"
    tier = FilesystemTier(FsTierConfig(root_dir=str(root)), region, stranger)
    try:
        fill(region, 0, key)
        tier.submit_store(TransferJob(1, (key,), (0,)))
        assert collect(tier, [1])[1].ok
    finally:
        tier.close()
    path.write_bytes(chunk_path(root, stranger, key).read_bytes())


CORRUPTIONS: dict[str, tuple[Callable[..., None], str]] = {
    "flipped payload byte": (flip_payload_byte, "checksum"),
    "flipped header byte": (flip_header_byte, "header"),
    "truncated payload": (truncate, "length"),
    "truncated header": (truncate_into_header, "short"),
    "trailing bytes": (append_garbage, "length"),
    "swapped files": (swap_with_next, "key"),
    "another identity": (foreign_identity, "identity"),
}


def store_through(manager: TieringManager, keys: list[ChunkKey]) -> None:
    store(manager, keys)
    assert manager.wait_idle(timeout=10)


@pytest.mark.parametrize("damage", list(CORRUPTIONS))
def test_damaged_chunk_is_detected_removed_and_recomputed(tmp_path, identity, damage):
    corrupt, reason = CORRUPTIONS[damage]
    root = tmp_path / "cache"
    tiers = [{"type": "fs", "root_dir": str(root), "name": "disk"}]
    keys = make_keys(identity, 4)
    with TieringManager(config(8, secondary_tiers=tiers), identity) as writer:
        store_through(writer, keys)
    target = chunk_path(root, identity, keys[1])
    corrupt(target, key=keys[1], identity=identity, next_path=chunk_path(root, identity, keys[2]))

    with TieringManager(config(8, secondary_tiers=tiers), identity) as reader:
        assert settle(reader, keys) == 1
        (slot,) = reader.prepare_load(keys[:1])
        assert holds(reader.region, slot, keys[0])
        reader.complete_load(keys[:1])
        stats = reader.stats()["tiers"]["disk"]
        assert stats[f"integrity.{reason}"] >= 1
        assert not target.exists()
        assert sum(v for k, v in stats.items() if k.startswith("integrity.")) == (
            2 if damage == "swapped files" else 1
        )
