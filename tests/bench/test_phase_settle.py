"""``phase.settle_writes``: the engine benches wait for a phase's trailing writes before the next
strategy's phase, on a real directory written by a real thread, and never wait for ever."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from kvtier.bench.phase import quiet_bytes, settle_writes, tree_bytes


def _writer(folder: Path, files: int, pause_s: float) -> threading.Thread:
    def write() -> None:
        for index in range(files):
            (folder / f"chunk-{index}").write_bytes(b"x" * 4096)
            time.sleep(pause_s)

    thread = threading.Thread(target=write)
    thread.start()
    return thread


def test_it_returns_after_the_writes_stop_and_syncs_what_they_wrote(tmp_path: Path) -> None:
    synced: list[int] = []
    writer = _writer(tmp_path, files=12, pause_s=0.05)  # writes for about 0.6 s, 50 ms apart
    waited = settle_writes(
        [str(tmp_path)], quiet_s=0.5, sync=lambda: synced.append(tree_bytes(str(tmp_path)))
    )
    writer.join()
    assert synced == [12 * 4096]  # once, after the last write
    assert waited >= 0.55  # it saw the pauses between writes as growth, not as quiet


def test_a_directory_that_never_stops_growing_is_waited_for_at_most_the_limit(
    tmp_path: Path,
) -> None:
    stop = threading.Event()

    def write() -> None:
        index = 0
        while not stop.is_set():
            (tmp_path / f"chunk-{index}").write_bytes(b"x")
            index += 1
            time.sleep(0.01)

    writer = threading.Thread(target=write)
    writer.start()
    synced: list[bool] = []
    try:
        waited = settle_writes(
            [str(tmp_path)], quiet_s=1.0, limit_s=1.5, sync=lambda: synced.append(True)
        )
    finally:
        stop.set()
        writer.join()
    assert 1.5 <= waited < 10 and synced == [True]


def test_quiet_or_missing_directories_cost_the_quiet_time_only(tmp_path: Path) -> None:
    (tmp_path / "old").write_bytes(b"x" * 100)
    synced: list[bool] = []
    waited = settle_writes(
        [str(tmp_path), str(tmp_path / "missing")], quiet_s=0.1, sync=lambda: synced.append(True)
    )
    assert 0.1 <= waited < 2 and synced == [True]


def test_no_directories_only_sync(tmp_path: Path) -> None:
    synced: list[bool] = []
    assert settle_writes([], sync=lambda: synced.append(True)) < 0.1 and synced == [True]


def test_odd_entries_are_neither_opened_nor_followed(tmp_path: Path) -> None:
    """A FIFO (opening it would block), a symlink loop, a dangling link, and a link to a
    directory elsewhere that keeps growing: counted as nothing, waited for the quiet time only."""
    tier = tmp_path / "tier"
    tier.mkdir()
    (tier / "chunk").write_bytes(b"x" * 300)
    os.mkfifo(tier / "fifo")
    (tier / "loop-a").symlink_to(tier / "loop-b")
    (tier / "loop-b").symlink_to(tier / "loop-a")
    (tier / "dangling").symlink_to(tmp_path / "nowhere")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tier / "outside").symlink_to(elsewhere, target_is_directory=True)
    stop = threading.Event()

    def grow_elsewhere() -> None:
        with open(elsewhere / "growing", "ab") as out:
            while not stop.wait(0.01):
                out.write(b"y" * 100)
                out.flush()

    writer = threading.Thread(target=grow_elsewhere)
    writer.start()
    try:
        start = time.perf_counter()
        assert quiet_bytes([str(tier)], quiet_s=0.1, limit_s=10) == 300
        assert time.perf_counter() - start < 2
    finally:
        stop.set()
        writer.join()
