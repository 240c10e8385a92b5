"""A peer server under hostile clients that never finish a message: memory stays bounded.

The serving manager runs in this process (its own driver thread answers peers), so its memory is
this process's ``VmRSS``. The attackers are other processes speaking raw ZMTP
(``hostile_client``); an honest p2p client keeps fetching meanwhile, each fetch with a deadline.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from kvtier import CacheIdentity, TieringManager
from kvtier.config import P2PTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.peer import protocol as proto
from kvtier.tiers.peer.tier import PeerTier
from tests.conftest import SMALL_LAYOUT, collect, config, fill, holds, make_keys, wait_for
from tests.tiers.s3_server import free_port

ROOT = Path(__file__).resolve().parents[3]
IDENTITY = CacheIdentity(model="test/model", revision="r1", layout=SMALL_LAYOUT)
KEYS = make_keys(IDENTITY, 8)
#: Growth of this process allowed while attacked; unbounded, it grew by gigabytes.
BOUND_MB = 200
ATTACK_S = 6.0
JOB_IDS = itertools.count(1)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.fixture
def server() -> Iterator[TieringManager]:
    """A serving manager (stores not accepted: the default) holding ``KEYS``."""
    manager = TieringManager(config(16, serve={"port": free_port()}), IDENTITY)
    plan = manager.prepare_store(KEYS)
    assert plan is not None
    for key, slot in zip(plan.keys, plan.slots):
        fill(manager.region, slot, key)
    manager.complete_store(plan.keys)
    yield manager
    manager.close()


@pytest.fixture
def honest(server: TieringManager) -> Iterator[tuple[PeerTier, HostRegion]]:
    assert server.peer_server is not None
    region = HostRegion(4, SMALL_LAYOUT.chunk_bytes)
    p2p = P2PTierConfig(host="127.0.0.1", port=server.peer_server.port, timeout_s=20.0)
    tier = PeerTier(p2p, region, IDENTITY)
    yield tier, region
    tier.close()


def honest_fetch(tier: PeerTier, region: HostRegion) -> None:
    """Two chunks, byte-identical, answered within a deadline (not a speed bound)."""
    region.numpy(0)[:] = 0
    job_id = next(JOB_IDS)
    tier.submit_load(TransferJob(job_id, tuple(KEYS[:2]), (0, 1)))
    result = collect(tier, [job_id], timeout=60)[job_id]
    assert result.ok, f"the honest client was not answered: {result.error}"
    assert holds(region, 0, KEYS[0]) and holds(region, 1, KEYS[1])


class Attacker:
    """``hostile_client`` in a subprocess; a thread records this process's peak growth, and
    stops the attack once it passes ``BOUND_MB`` (so a failing run stays small)."""

    def __init__(self, port: int, mode: str) -> None:
        self.base = self.peak = rss_mb()
        cmd = [sys.executable, "-m", "tests.tiers.peer.hostile_client", str(port), mode]
        self._proc = subprocess.Popen(cmd, cwd=ROOT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_mb())
            if self.peak - self.base > BOUND_MB:
                self._proc.kill()

    @property
    def growth_mb(self) -> float:
        return self.peak - self.base

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._proc.kill()
        self._proc.wait()


@pytest.mark.parametrize("mode", ["endless", "million"])
def test_unfinished_messages_are_cut_off_and_honest_clients_are_answered(server, honest, mode):
    """``endless``: frames that all say "more"; ``million``: one message of 10**6 empty frames."""
    tier, region = honest
    honest_fetch(tier, region)  # connected, and this process's memory settled
    assert server.peer_server is not None
    attacker = Attacker(server.peer_server.port, mode)
    try:
        end = time.monotonic() + ATTACK_S
        while time.monotonic() < end and attacker.growth_mb <= BOUND_MB:
            honest_fetch(tier, region)
            time.sleep(0.05)
    finally:
        attacker.stop()
    assert attacker.growth_mb <= BOUND_MB, f"the server grew by {attacker.growth_mb:.0f} MB"
    assert server.peer_server.stats().get("connections_dropped_runaway", 0) >= 1


def test_a_message_with_more_frames_than_any_request_drops_its_sender(server, honest):
    """A server that does not accept stores takes one-frame requests; more frames cut the peer."""
    assert server.peer_server is not None
    context = zmq.Context()
    try:
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(f"tcp://127.0.0.1:{server.peer_server.port}")
        dealer.send_multipart([proto.hello(1, IDENTITY.digest), b"x", b"y"])
        stats = server.peer_server.stats
        wait_for(lambda: stats().get("messages_dropped_oversized", 0) == 1, timeout=20)
        assert stats().get("connections_dropped_oversized", 0) == 1
        assert stats().get("malformed_messages", 0) == 0, "dropped before it was decoded"
    finally:
        context.destroy(linger=0)
    tier, region = honest
    honest_fetch(tier, region)
