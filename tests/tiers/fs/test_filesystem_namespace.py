"""The namespace pinned at start: a swap while the tier runs is refused, never followed.

Whoever can write ``root_dir`` may rename the namespace directory away and leave a symlink to a
directory of theirs in its place, with chunk files of their choosing in it (valid ones: the
checksum is not keyed). The tier must neither write there nor serve what is there.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier import CacheIdentity, ChunkKey
from kvtier.config import FsTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import MISS, TransferJob
from kvtier.tiers.fs import namespace as namespace_module
from kvtier.tiers.fs.tier import FilesystemTier
from tests.conftest import collect, fill, holds, make_keys, settle_lookup

pytestmark = pytest.mark.usefixtures("fs_io")


@pytest.fixture
def region(identity: CacheIdentity) -> HostRegion:
    return HostRegion(16, identity.layout.chunk_bytes)


@pytest.fixture
def tiers() -> Iterator[list[FilesystemTier]]:
    made: list[FilesystemTier] = []
    yield made
    for tier in made:
        tier.close()


def start(root: Path, region: HostRegion, identity: CacheIdentity, made: list) -> FilesystemTier:
    made.append(FilesystemTier(FsTierConfig(root_dir=str(root)), region, identity))
    made[-1].wait_scanned()
    return made[-1]


_job_ids = iter(range(1, 1 << 30))


def store(tier: FilesystemTier, region: HostRegion, keys: list[ChunkKey], contents=None) -> bool:
    """Store ``keys`` from slots 0.. (each filled with the pattern of ``contents``' key)."""
    slots = tuple(range(len(keys)))
    for slot, key in enumerate(contents or keys):
        fill(region, slot, key)
    job_id = next(_job_ids)
    tier.submit_store(TransferJob(job_id, tuple(keys), slots))
    return collect(tier, [job_id])[job_id].ok


def load(tier: FilesystemTier, keys: list[ChunkKey], first_slot: int = 8) -> set[ChunkKey]:
    job_id = next(_job_ids)
    tier.submit_load(
        TransferJob(job_id, tuple(keys), tuple(range(first_slot, first_slot + len(keys))))
    )
    return set(collect(tier, [job_id])[job_id].succeeded)


def files_under(directory: Path) -> set[str]:
    return {p.name for p in directory.rglob("*") if p.is_file() and len(p.name) >= 64}


@pytest.fixture
def attacker(tmp_path: Path, region: HostRegion, identity: CacheIdentity, tiers) -> Path:
    """A namespace outside ``root_dir`` whose chunk files, valid ones, hold the wrong bytes."""
    keys, other = make_keys(identity, 2, seed=1), make_keys(identity, 2, seed=99)
    planted = start(tmp_path / "attacker", region, identity, tiers)
    assert store(planted, region, keys, contents=other)  # key k, bytes of another key
    return Path(planted.namespace)


def swap(namespace: Path, target: Path, moved: Path) -> None:
    """Rename the namespace away and leave a symlink to ``target`` in its place."""
    namespace.rename(moved)
    namespace.symlink_to(target, target_is_directory=True)


def test_a_namespace_swapped_for_a_symlink_is_refused_never_followed(
    tmp_path, region, identity, tiers, attacker
):
    keys, new = make_keys(identity, 2, seed=1), make_keys(identity, 2, seed=2)
    root = tmp_path / "cache"
    tier = start(root, region, identity, tiers)
    assert store(tier, region, keys)
    planted = files_under(attacker)
    namespace = Path(tier.namespace)
    swap(namespace, attacker, root / "moved-away")

    assert not store(tier, region, new)  # refused, and counted
    assert files_under(attacker) == planted  # nothing written through the link
    assert load(tier, keys) == set()  # a miss, never the attacker's bytes
    attackers = make_keys(identity, 2, seed=99)  # the bytes in the attacker's files
    assert not any(holds(region, 8 + i, bytes_of) for i, bytes_of in enumerate(attackers))
    stats = tier.stats()
    assert stats["store_failed.namespace_swapped"] == 1
    assert stats["load_failed.namespace_swapped"] == 2
    assert stats.get("loaded_chunks", 0) == 0

    namespace.unlink()  # the directory put back: served and written again
    (root / "moved-away").rename(namespace)
    assert load(tier, keys) == set(keys)
    assert holds(region, 8, keys[0]) and holds(region, 9, keys[1])
    assert store(tier, region, new)
    assert files_under(attacker) == planted


def test_probes_of_a_swapped_namespace_are_misses(tmp_path, region, identity, tiers, attacker):
    keys = make_keys(identity, 2, seed=1)  # the attacker has chunk files for these
    tier = start(tmp_path / "cache", region, identity, tiers)
    swap(Path(tier.namespace), attacker, tmp_path / "moved-away")
    assert settle_lookup(tier, keys[0]) is MISS
    assert tier.stats()["probe_failed.namespace_swapped"] == 1


def exchange(first: Path, second: Path) -> None:
    """Swap two entries in one step (``renameat2(RENAME_EXCHANGE)``), as an attacker would:
    the namespace's path never stands empty."""
    libc = ctypes.CDLL(None, use_errno=True)
    at_cwd, rename_exchange = -100, 2
    paths = (os.fsencode(first), os.fsencode(second))
    if libc.renameat2(at_cwd, paths[0], at_cwd, paths[1], rename_exchange) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(first))


def test_stores_racing_a_swap_never_land_outside_the_root(
    tmp_path, region, identity, tiers, attacker
):
    """Stores run while another thread swaps the namespace with a link to the attacker's
    directory and back, atomically and many times: no chunk file ever appears there, and a
    store either lands in the pinned directory or fails as ``namespace_swapped``."""
    root = tmp_path / "cache"
    tier = start(root, region, identity, tiers)
    namespace, link = Path(tier.namespace), root / "link"
    link.symlink_to(attacker, target_is_directory=True)
    planted, done = files_under(attacker), threading.Event()

    def swapper() -> None:
        while not done.is_set():
            exchange(namespace, link)  # the namespace is now the link
            exchange(namespace, link)  # and back

    thread = threading.Thread(target=swapper)
    thread.start()
    try:
        batches = [make_keys(identity, 2, seed=s) for s in range(10, 60)]
        stored = [store(tier, region, keys) for keys in batches]
    finally:
        done.set()
        thread.join()
    assert files_under(attacker) == planted
    failures = {k: v for k, v in tier.stats().items() if k.startswith("store_failed.")}
    assert failures in ({}, {"store_failed.namespace_swapped": stored.count(False)})
    written = [key for keys, ok in zip(batches, stored, strict=True) if ok for key in keys]
    assert written and files_under(namespace) >= {key.hex() for key in written}


def test_a_namespace_removed_while_running_is_made_again(tmp_path, region, identity, tiers):
    """The cache wiped by hand while the tier runs (nothing in its place): the next store
    makes the namespace again, a real directory, and writes there."""
    root = tmp_path / "cache"
    tier = start(root, region, identity, tiers)
    keys = make_keys(identity, 2, seed=3)
    namespace = Path(tier.namespace)
    namespace.rename(tmp_path / "wiped")
    assert store(tier, region, keys)
    assert namespace.is_dir() and not namespace.is_symlink()
    assert len(files_under(namespace)) == 2
    assert (namespace / "identity.json").is_file()
    assert load(tier, keys) == set(keys)


@pytest.mark.parametrize("grace", [0.0, 3600.0])
def test_a_namespace_wiped_again_and_again_holds_a_bounded_number_of_descriptors(
    tmp_path, region, identity, tiers, monkeypatch, grace
):
    """Each wipe leaves the old pin open for the grace (a thread may be about to use it), then
    closes it at the next wipe: with no grace the tier holds one old pin whatever the number of
    wipes; with a long one, one per wipe within it. Every store after a wipe lands and loads."""
    monkeypatch.setattr(namespace_module, "REPLACED_PIN_GRACE_S", grace)
    tier = start(tmp_path / "cache", region, identity, tiers)
    namespace, wipes = Path(tier.namespace), 6
    before = len(os.listdir("/proc/self/fd"))
    for wipe in range(wipes):
        namespace.rename(tmp_path / f"wiped-{wipe}")
        keys = make_keys(identity, 1, seed=wipe)
        assert store(tier, region, keys) and load(tier, keys) == set(keys)
    held = len(os.listdir("/proc/self/fd")) - before
    assert held == (1 if grace == 0 else wipes)
