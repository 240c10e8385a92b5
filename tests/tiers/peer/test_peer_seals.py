"""What a peer server seals its replies with (``server_seals``), and the race it closes.

A chunk served without a hold may have its slot evicted and given to another chunk before the
server thread seals it. Sealed then, another chunk's bytes would carry this key's checksum and
verify as this chunk at the client: wrong KV. The slot's generation, taken when the fetch was
answered and checked again after sealing, makes that a miss instead.
"""

from __future__ import annotations

import os

import pytest

from kvtier import TieringManager
from kvtier.config import P2PTierConfig
from kvtier.core.host_slots import HostTier
from kvtier.errors import IntegrityError
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.peer import server_seals
from kvtier.tiers.peer.server_seals import ServedSeals
from kvtier.tiers.peer.tier import PeerTier
from kvtier.tiers.shared.sealing import ChecksumSealer, KeyedSealer
from tests.conftest import collect, config, fill, holds, make_keys
from tests.tiers.peer.test_peer_holds import IDENTITY, LAYOUT, SLOTS, store
from tests.tiers.s3_server import free_port

A, B = make_keys(IDENTITY, 2)
DIGEST = IDENTITY.digest


def one_slot() -> tuple[HostTier, HostRegion]:
    """A host tier of one slot holding chunk A (ready)."""
    host, region = HostTier(1), HostRegion(1, 4096)
    (slot,), _ = host.allocate([A])
    fill(region, slot, A)
    host.complete_write([A], True)
    return host, region


def reuse_for_b(host: HostTier, region: HostRegion) -> None:
    """Evict A and write chunk B in its slot, as the manager does between a fetch and its send."""
    allocated = host.allocate([B])
    assert allocated is not None and allocated[1] == [A]
    fill(region, allocated[0][0], B)


def test_every_allocation_of_a_slot_bumps_its_generation():
    host = HostTier(1)
    assert host.generation(0) == 0
    host.allocate([A])
    assert host.generation(0) == 1
    host.complete_write([A], True)
    host.touch([A])
    assert host.generation(0) == 1  # being read or used changes nothing
    host.allocate([B])  # evicts A
    assert host.generation(0) == 2


@pytest.mark.parametrize(
    "sealer",
    [ChecksumSealer(), KeyedSealer((os.urandom(32),), False, decrypts=False)],
    ids=["checksum", "keyed"],
)
def test_a_slot_given_to_another_chunk_before_its_seal_is_not_sent(sealer):
    host, region = one_slot()
    seals = ServedSeals(sealer, DIGEST)
    stamp = host.generation(0)
    header = seals.header(A, region.view(0), 0, stamp, host.generation)
    assert header is not None  # the slot unchanged: sealed, and it opens as A
    sealer.open(header, region.view(0), DIGEST, A)

    reuse_for_b(host, region)
    assert seals.header(A, region.view(0), 0, stamp, host.generation) is None
    # What the old code sent: B's bytes sealed as A. They verify as A, which is the bug.
    forged = sealer.seal(DIGEST, A, region.view(0))
    sealer.open(forged, region.view(0), DIGEST, A)


def test_a_chunk_is_hashed_once_per_residency(monkeypatch):
    host, region = one_slot()
    hashed: list[int] = []
    real = server_seals.codec.checksum
    monkeypatch.setattr(server_seals.codec, "checksum", lambda v: hashed.append(0) or real(v))
    seals = ServedSeals(ChecksumSealer(), DIGEST)
    first = seals.header(A, region.view(0), 0, host.generation(0), host.generation)
    again = seals.header(A, region.view(0), 0, host.generation(0), host.generation)
    assert first == again and len(hashed) == 1

    reuse_for_b(host, region)
    host.complete_write([B], True)
    header = seals.header(B, region.view(0), 0, host.generation(0), host.generation)
    assert len(hashed) == 2, "a new residency is hashed again"
    assert header is not None
    ChecksumSealer().open(header, region.view(0), DIGEST, B)
    with pytest.raises(IntegrityError):
        ChecksumSealer().open(first, region.view(0), DIGEST, A)


def test_the_same_key_stored_again_in_its_slot_is_hashed_again():
    """A's slot is given up and A written there again, with other bytes (a recompute that came
    out different): the kept checksum was the old residency's, so the new bytes are hashed."""
    host, region = one_slot()
    seals = ServedSeals(ChecksumSealer(), DIGEST)
    assert seals.header(A, region.view(0), 0, host.generation(0), host.generation) is not None
    reuse_for_b(host, region)
    host.complete_write([B], False)  # B's write failed: its slot is free
    allocated = host.allocate([A])
    assert allocated is not None and allocated[0] == [0]
    region.view(0)[:64] = bytes(64)
    host.complete_write([A], True)
    header = seals.header(A, region.view(0), 0, host.generation(0), host.generation)
    assert header is not None
    ChecksumSealer().open(header, region.view(0), DIGEST, A)


def test_the_server_drops_a_chunk_whose_slot_was_reused_and_the_client_misses_it(monkeypatch):
    manager = TieringManager(config(SLOTS, LAYOUT, serve={"port": free_port()}), IDENTITY)
    keys = make_keys(IDENTITY, 3, seed=5)
    assert store(manager, keys)
    server = manager.peer_server
    assert server is not None
    real = server._seals.header

    def reused_meanwhile(key, view, slot, stamp, generation):  # the manager's reuse of slot
        if key == keys[1]:
            with manager.runtime.lock:
                manager.host._generations[slot] += 1
                view[:] = os.urandom(len(view))
        return real(key, view, slot, stamp, generation)

    monkeypatch.setattr(server._seals, "header", reused_meanwhile)
    region = HostRegion(3, LAYOUT.chunk_bytes)
    p2p = P2PTierConfig(host="127.0.0.1", port=server.port, timeout_s=10.0)
    tier = PeerTier(p2p, region, IDENTITY)
    try:
        tier.submit_load(TransferJob(1, tuple(keys), (0, 1, 2)))
        result = collect(tier, [1], timeout=30)[1]
    finally:
        tier.close()
        manager.close()
    assert result.succeeded == {keys[0], keys[2]} and result.failed == {keys[1]}
    assert not result.integrity_failed  # never sent: nothing to fail verification
    assert holds(region, 0, keys[0]) and holds(region, 2, keys[2])
    assert server.stats()["fetch_slot_reused"] == 1
