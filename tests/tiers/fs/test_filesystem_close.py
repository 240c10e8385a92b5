"""Closing an fs tier, or a manager over one, while a write is stuck on the medium: close
returns after ``workers.CLOSE_WAIT_S``, and the stuck thread is left with its files open.

The tier and its files are real; the stuck write is the tier's ``fault_hook`` blocking.
"""

from __future__ import annotations

import threading
from pathlib import Path

from kvtier import TieringConfig, TieringManager
from kvtier.config import FsTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs.tier import FilesystemTier
from kvtier.tiers.shared import workers
from tests.conftest import collect, fill, make_keys, store, wait_for


def stuck_writes(tier: FilesystemTier) -> tuple[threading.Event, threading.Event]:
    """Makes every store block in ``tier`` until the second event is set; the first is set
    once a store is stuck."""
    stuck, release = threading.Event(), threading.Event()

    def hook(op: str, key: object) -> None:
        if op == "store":
            stuck.set()
            release.wait(60)

    tier.fault_hook = hook
    return stuck, release


def closed_in_time(close, *args) -> bool:
    """Whether ``close(*args)``, run in a thread, has returned within 30 s (a deadline for a
    hang, not a speed bound)."""
    closer = threading.Thread(target=close, args=args, daemon=True)
    closer.start()
    closer.join(30)
    return not closer.is_alive()


def test_a_tier_closes_with_a_write_stuck_and_keeps_its_files_open(
    tmp_path: Path, identity, monkeypatch, caplog
):
    monkeypatch.setattr(workers, "CLOSE_WAIT_S", 0.3)
    region = HostRegion(4, identity.layout.chunk_bytes)
    tier = FilesystemTier(FsTierConfig(root_dir=str(tmp_path / "fs")), region, identity)
    assert tier.wait_scanned(10)
    stuck, release = stuck_writes(tier)
    keys = make_keys(identity, 2)
    for slot, key in enumerate(keys):
        fill(region, slot, key)
    tier.submit_store(TransferJob(1, (keys[0],), (0,)))
    assert stuck.wait(10)
    assert closed_in_time(tier.close)
    assert "fs-write_0 still busy at close" in caplog.text
    assert "its files stay open" in caplog.text
    release.set()  # the stuck write goes on, into the namespace it was writing to
    wait_for(lambda: list((tmp_path / "fs").rglob(keys[0].hex())), what="the late chunk file")
    tier.submit_store(TransferJob(2, (keys[1],), (1,)))
    assert not collect(tier, [2])[2].ok, "a closed tier takes no job"


def test_a_manager_closes_with_a_tier_write_stuck(tmp_path: Path, identity, monkeypatch):
    monkeypatch.setattr(workers, "CLOSE_WAIT_S", 0.3)
    stride = -(-identity.layout.chunk_bytes // 4096) * 4096
    config = TieringConfig.from_dict(
        {
            "cpu_bytes_to_use": 4 * stride,
            "secondary_tiers": [{"type": "fs", "root_dir": str(tmp_path / "fs")}],
        }
    )
    m = TieringManager(config, identity)
    stuck, release = stuck_writes(m.tiers[0])
    store(m, make_keys(identity, 1))
    assert stuck.wait(10)
    assert closed_in_time(m.close, 0.3)
    release.set()
