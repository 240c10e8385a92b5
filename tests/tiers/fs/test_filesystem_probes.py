"""Where the fs tier asks the disk about a key it has not seen (``kvtier.tiers.fs.probes``).

The tiers and their files are real. The file system type is the only thing faked, to see the
choice ``probe: "auto"`` makes on a network file system, which this machine has none of.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from kvtier import CacheIdentity, TieringConfig, TieringManager
from kvtier.config import FsTierConfig
from kvtier.errors import ConfigError
from kvtier.region import HostRegion
from kvtier.tiers.base import HIT, MISS, RETRY, TransferJob
from kvtier.tiers.fs import probes
from kvtier.tiers.fs.tier import FilesystemTier
from kvtier.tiers.shared.probes_in_flight import MAX_PROBING
from tests.conftest import collect, fill, holds, make_keys, settle_lookup

NFS_MAGIC = 0x6969


@pytest.fixture
def region(identity: CacheIdentity) -> HostRegion:
    return HostRegion(8, identity.layout.chunk_bytes)


def make_tier(root: Path, region: HostRegion, identity: CacheIdentity, **options: object):
    config = FsTierConfig(root_dir=str(root), **options)  # type: ignore[arg-type]
    return FilesystemTier(config, region, identity)


def written_elsewhere(root: Path, region: HostRegion, identity: CacheIdentity, n: int = 2):
    """``n`` chunks another instance stored under ``root`` (after ours started)."""
    keys = make_keys(identity, n, seed=11)
    other = make_tier(root, region, identity)
    try:
        for slot, key in enumerate(keys):
            fill(region, slot, key)
        other.submit_store(TransferJob(1, tuple(keys), tuple(range(n))))
        assert collect(other, [1])[1].ok
    finally:
        other.close()
    return keys


def test_auto_probes_inline_exactly_on_the_local_file_system_types(tmp_path, monkeypatch):
    local = probes.filesystem_type(str(tmp_path)) in probes.LOCAL
    assert probes.probes_inline("auto", str(tmp_path)) is local
    assert probes.probes_inline("auto", "/proc") is False  # procfs: not a known local type
    assert probes.probes_inline("auto", str(tmp_path / "absent")) is False  # statfs fails
    assert probes.probes_inline("inline", "/proc") is True
    assert probes.probes_inline("background", str(tmp_path)) is False
    monkeypatch.setattr(sys, "platform", "darwin")
    assert probes.filesystem_type(str(tmp_path)) is None
    assert probes.probes_inline("auto", str(tmp_path)) is False


def test_tmpfs_and_this_disk_have_their_known_types(tmp_path):
    assert probes.filesystem_type("/dev/shm") == 0x01021994  # tmpfs
    assert probes.filesystem_type(str(tmp_path)) in probes.LOCAL, "the tests' disk is local"


def test_auto_on_a_network_file_system_probes_in_the_background(
    tmp_path, region, identity, monkeypatch
):
    monkeypatch.setattr(probes, "filesystem_type", lambda path: NFS_MAGIC)
    tier = make_tier(tmp_path, region, identity)
    try:
        (key,) = make_keys(identity, 1, seed=3)
        assert tier.stats()["inline_probes"] == 0
        assert tier.lookup(key) is RETRY
        assert settle_lookup(tier, key) is MISS
    finally:
        tier.close()


def test_an_inline_probe_finds_what_another_instance_wrote_and_serves_it(
    tmp_path, region, identity
):
    tier = make_tier(tmp_path, region, identity, probe="inline")
    try:
        assert tier.wait_scanned(10)
        keys = written_elsewhere(tmp_path, region, identity)
        assert [tier.lookup(k) for k in keys] == [HIT, HIT]
        assert tier.stats()["probe_hits"] == 2
        tier.submit_load(TransferJob(2, tuple(keys), (4, 5)))
        assert collect(tier, [2])[2].ok
        assert holds(region, 4, keys[0]) and holds(region, 5, keys[1])
    finally:
        tier.close()


def test_a_miss_found_inline_is_remembered_for_negative_ttl_s(tmp_path, region, identity):
    tier = make_tier(tmp_path, region, identity, probe="inline", negative_ttl_s=60.0)
    try:
        (key,) = make_keys(identity, 1, seed=11)
        assert tier.lookup(key) is MISS
        written_elsewhere(tmp_path, region, identity, 1)
        assert tier.lookup(key) is MISS, "within negative_ttl_s the disk is not asked again"
        assert tier.stats()["probe_misses"] == 1
    finally:
        tier.close()


@pytest.mark.parametrize("probe", ["inline", "background"])
def test_a_negative_ttl_of_zero_still_settles_a_lookup(tmp_path, region, identity, probe):
    """The probe's MISS reaches the lookup that waited for it (with no memory of misses, a
    background probe's answer used to be forgotten before it was read: RETRY forever)."""
    tier = make_tier(tmp_path, region, identity, probe=probe, negative_ttl_s=0)
    try:
        (key,) = make_keys(identity, 1, seed=12)
        assert settle_lookup(tier, key) is MISS
        assert tier.lookup(key) is (MISS if probe == "inline" else RETRY), "asked again"
    finally:
        tier.close()


def test_a_fault_hook_sends_probes_to_the_background_where_it_may_block(tmp_path, region, identity):
    """A hook may block (a drill of a hung mount): with one set, lookup never calls it on the
    engine's thread, even with ``probe: "inline"``."""
    tier = make_tier(tmp_path, region, identity, probe="inline")
    entered, release = threading.Event(), threading.Event()

    def hung_mount(op: str, key: object) -> None:
        entered.set()
        release.wait(30)

    tier.fault_hook = hung_mount
    try:
        (key,) = make_keys(identity, 1, seed=4)
        assert tier.lookup(key) is RETRY
        assert entered.wait(10), "the probe ran on a probe thread"
        assert tier.lookup(key) is RETRY, "still asking: the answer is not known yet"
        release.set()
        assert settle_lookup(tier, key) is MISS
    finally:
        release.set()
        tier.close()


def test_a_hung_mount_queues_at_most_max_probing_probes_then_answers_miss(
    tmp_path, region, identity
):
    """Every probe thread stuck in a ``stat``: up to ``MAX_PROBING`` keys wait (``RETRY``), the
    next is a miss at once and counted; a key already waiting still waits. Once the mount
    answers, the queue drains and new keys are probed again."""
    tier = make_tier(tmp_path, region, identity, probe="background")
    release = threading.Event()
    tier.fault_hook = lambda op, key: release.wait(30) if op == "probe" else None
    keys = make_keys(identity, MAX_PROBING + 2, seed=5)
    try:
        assert all(tier.lookup(key) is RETRY for key in keys[:MAX_PROBING])
        assert tier.lookup(keys[-2]) is MISS
        assert tier.lookup(keys[0]) is RETRY, "already queued: still waiting for its answer"
        assert tier.stats()["probe_skipped_backlog"] == 1
        release.set()
        assert settle_lookup(tier, keys[0]) is MISS
        assert settle_lookup(tier, keys[MAX_PROBING - 1]) is MISS
        assert tier.lookup(keys[-1]) is RETRY, "room again: probed, not refused"
        assert tier.stats()["probe_skipped_backlog"] == 1
    finally:
        release.set()
        tier.close()


def test_a_manager_over_an_inline_fs_tier_answers_a_new_prompt_at_once(tmp_path, identity):
    """No RETRY round trip for a prompt no one has stored: the engine learns it is a miss in
    the same call."""
    stride = -(-identity.layout.chunk_bytes // 4096) * 4096
    fs = {"type": "fs", "root_dir": str(tmp_path), "probe": "inline"}
    config = TieringConfig.from_dict({"cpu_bytes_to_use": 4 * stride, "secondary_tiers": [fs]})
    with TieringManager(config, identity) as m:
        assert m.lookup(make_keys(identity, 8, seed=5)) == 0


@pytest.mark.parametrize("value", ["sometimes", "", "INLINE", 1])
def test_probe_takes_only_its_three_values(tmp_path, value):
    fs = {"type": "fs", "root_dir": str(tmp_path), "probe": value}
    with pytest.raises(ConfigError, match="probe"):
        TieringConfig.from_dict({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [fs]})
