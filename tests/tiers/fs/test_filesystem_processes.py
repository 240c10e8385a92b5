"""The filesystem tier across real OS processes: sharing a directory, a killed writer, a size limit.

The other processes run ``tests/tiers/fs/fs_worker.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from kvtier.config import FsTierConfig
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs.scan import HOST_TAG
from kvtier.tiers.fs.tier import FilesystemTier
from tests.conftest import chunk_pattern, collect
from tests.tiers.fs.fs_worker import identity_for

REPO = Path(__file__).resolve().parents[3]


def worker(*args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.tiers.fs.fs_worker", *args]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)


def outcome(process: subprocess.Popen[str]) -> dict:
    stdout, _ = process.communicate(timeout=120)
    assert process.returncode == 0, stdout
    return json.loads(stdout.strip().splitlines()[-1])


def temp_files(root: Path) -> list[Path]:
    return list(root.rglob("*.tmp"))


def integrity_failures(stats: dict) -> int:
    return sum(v for k, v in stats.items() if k.startswith("integrity."))


def test_two_processes_share_chunks_and_write_the_same_keys_at_once(tmp_path):
    """A and B each store their own keys plus one shared set at the same moment, then each
    loads the other's keys and the shared ones: all byte-identical, nothing corrupt."""
    root, go = tmp_path / "cache", tmp_path / "go"
    done = {name: str(tmp_path / f"{name}.done") for name in "ab"}
    seeds = {"a": 1, "b": 2}
    processes = {
        name: worker(
            "share",
            "--root",
            str(root),
            "--n",
            "32",
            "--go",
            str(go),
            "--done",
            done[name],
            "--seed",
            str(seeds[name]),
            "--other",
            str(seeds[other]),
            "--other-done",
            done[other],
        )
        for name, other in (("a", "b"), ("b", "a"))
    }
    go.touch()
    for name, process in processes.items():
        result = outcome(process)
        assert result["stored_ok"], name
        assert result["loaded"] == result["identical"] == 64, (name, result)
        assert result["wrong"] == 0 and integrity_failures(result["stats"]) == 0
    assert temp_files(root) == []


def dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def kill_writer_midway(root: Path, blocks_per_chunk: int, num_jobs: int) -> list[ChunkKey]:
    """Start a writer, SIGKILL it after ``num_jobs`` stores finished; the keys it reported."""
    process = worker(
        "store-forever", "--root", str(root), "--blocks-per-chunk", str(blocks_per_chunk)
    )
    assert process.stdout is not None
    reported: list[ChunkKey] = []
    for _ in range(num_jobs):
        line = process.stdout.readline()
        assert line, "the writer died before it was killed"
        reported += [ChunkKey(bytes.fromhex(h)) for h in line.split()]
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    return reported


def test_writer_killed_mid_store_leaves_only_complete_chunks(tmp_path):
    """A writer storing 128 KiB chunks on 16 threads is SIGKILLed. After restart: no temporary
    file remains, every chunk file loads and verifies, and every store it reported is there."""
    root, blocks_per_chunk = tmp_path / "cache", 64
    identity = identity_for(blocks_per_chunk)
    reported = kill_writer_midway(root, blocks_per_chunk, num_jobs=24)
    namespace = root / identity.hexdigest
    planted = namespace / "00" / "00" / f"{'0' * 64}.{HOST_TAG}-{dead_pid()}-deadbeef-0.tmp"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(b"half a chunk")

    region = HostRegion(32, identity.layout.chunk_bytes)
    tier = FilesystemTier(FsTierConfig(root_dir=str(root)), region, identity)
    try:
        assert tier.wait_scanned(timeout=30)
        assert temp_files(root) == []
        on_disk = [ChunkKey(bytes.fromhex(p.name)) for p in namespace.glob("??/??/*")]
        assert set(reported) <= set(on_disk)
        assert tier.stats()["index_chunks"] == len(on_disk)
        for start in range(0, len(on_disk), 32):
            keys = on_disk[start : start + 32]
            tier.submit_load(TransferJob(start, tuple(keys), tuple(range(len(keys)))))
            assert collect(tier, [start])[start].succeeded == frozenset(keys)
            for slot, key in enumerate(keys):
                assert bytes(region.view(slot)) == chunk_pattern(key, region.slot_bytes)
        assert integrity_failures(tier.stats()) == 0
    finally:
        tier.close()


def test_file_size_limit_fails_stores_cleanly_and_loads_keep_working(tmp_path):
    """Under RLIMIT_FSIZE (writes fail with EFBIG) every store job fails and is counted, no
    partial file is left behind, and chunks stored before still load byte-identical."""
    root = tmp_path / "cache"
    result = outcome(worker("fsize", "--root", str(root)))
    assert result["stored_before"] and not result["stored_after"]
    assert result["stats"].get("store_failed.EFBIG", 0) >= 1
    assert result["loaded"] == result["identical"] == 4
    namespace = root / identity_for(2).hexdigest
    assert len(list(namespace.glob("??/??/*"))) == 4
    assert temp_files(root) == []
    assert os.path.exists(namespace / "identity.json")
