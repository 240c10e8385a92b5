"""A serving instance also serves the chunks that only its own storage tiers hold.

The server (a real process with a filesystem tier and 4 host slots) stored 8 chunks, so the
first 4 left its host memory and live on in its filesystem. A peer's lookup of those answers
COMING while the server promotes them; the client asks again, then fetches them verified.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier import TieringManager
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.telemetry.kv_events import EventKind
from kvtier.tiers.base import MISS, RETRY, JobResult, Lookup, SecondaryTier, TransferJob
from tests.conftest import config, holds, make_keys, on_a_free_port, settle_lookup
from tests.tiers.peer.test_peer import p2p, settle
from tests.tiers.peer_node import PeerNode


@pytest.fixture
def fs_server(tmp_path: Path) -> Iterator[PeerNode]:
    """Stored ``make_keys(identity, 8)``; the first 4 are only in its filesystem tier."""
    node = PeerNode(0, "--store", "8", "--slots", "4", "--fs", str(tmp_path)).start()
    yield node
    node.kill()


def test_chunks_only_in_the_servers_filesystem_load_byte_identical(fs_server, identity):
    keys = make_keys(identity, 8)
    with TieringManager(config(16, secondary_tiers=[p2p(fs_server.port)]), identity) as m:
        for part in (keys[:4], keys[4:]):  # the second part was evicted by the first's promotion
            assert settle(m, part) == 4
            slots = m.prepare_load(part)
            assert all(holds(m.region, slot, key) for key, slot in zip(part, slots))
            m.complete_load(part)
        sources = {e.source for e in m.take_events() if e.kind is EventKind.PROMOTED}
        stats = m.tiers[0].stats()
    assert sources == {"p2p"}
    assert stats["fetched_chunks"] == 8
    assert stats["lookup_reasks"] >= 1, "the server answered COMING, then HELD"


def test_a_chunk_held_nowhere_on_the_server_is_a_miss_at_once(fs_server, identity):
    region = HostRegion(4, identity.layout.chunk_bytes)
    tier = fs_server.tier(region, identity, timeout_s=1.0)
    try:
        settle_lookup(tier, make_keys(identity, 1)[0])  # connected
        held = tier.stats().get("lookup_reasks", 0)  # asks for a chunk the server holds
        assert settle_lookup(tier, make_keys(identity, 1, seed=404)[0]) is MISS
        missing = tier.stats().get("lookup_reasks", 0) - held
        assert missing <= held, "asked again and again, as if the server had answered COMING"
    finally:
        tier.close()


class Undecided(SecondaryTier):
    """A tier whose answer never comes: every lookup is RETRY."""

    name = "undecided"

    def lookup(self, key: ChunkKey) -> Lookup:
        return RETRY

    def submit_store(self, job: TransferJob) -> None:
        raise AssertionError("nothing is stored")

    def submit_load(self, job: TransferJob) -> None:
        raise AssertionError("nothing is promoted")

    def get_finished_jobs(self) -> list[JobResult]:
        return []

    def close(self) -> None:
        pass


def test_a_peer_that_keeps_answering_coming_is_a_miss_after_timeout(identity):
    serving, port = on_a_free_port(
        lambda port: TieringManager(config(4, serve={"port": port}), identity, tiers=[Undecided()])
    )
    region = HostRegion(4, identity.layout.chunk_bytes)
    tier = PeerNode(port).tier(region, identity, timeout_s=0.3)
    try:
        assert settle_lookup(tier, make_keys(identity, 1)[0]) is MISS
        assert tier.stats()["lookup_reasks"] >= 2, "it asked again while the answer was COMING"
    finally:
        tier.close()
        serving.close()
    assert serving.peer_server is not None
    assert serving.peer_server.stats()["lookup_coming"] >= 3
