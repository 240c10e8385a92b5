"""Payloads received straight into host slots: verified there, and only for requests in flight.

A scripted peer (a bare ROUTER) shakes hands and answers each FETCH as the scenario says.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import msgpack
import numpy as np
import pytest
import zmq

from kvtier import CacheIdentity
from kvtier.config import P2PTierConfig
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import JobResult, TransferJob
from kvtier.tiers.peer import protocol as proto
from kvtier.tiers.peer.tier import PeerTier
from kvtier.tiers.shared import codec
from tests.conftest import chunk_pattern, collect, make_keys

Answer = Callable[[int, list[ChunkKey]], list[bytes]]  # (req_id, keys) -> reply frames
Fetched = tuple[JobResult, dict[str, int], np.ndarray]  # result, tier stats, slot 0


class ScriptedPeer:
    def __init__(self, answer: Answer) -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self.port = self._socket.bind_to_random_port("tcp://127.0.0.1")
        self._answer, self._stop = answer, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._socket.poll(20):
                continue
            peer, meta, *_ = self._socket.recv_multipart()
            kind, req_id, body = msgpack.unpackb(meta)
            if kind == proto.HELLO:
                frames = [proto.encode(proto.HELLO, req_id, [True, False, ""])]
            else:
                frames = self._answer(req_id, [ChunkKey(k) for k in body])
            self._socket.send_multipart([peer, *frames])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._context.destroy(linger=0)


def chunk_frames(identity: CacheIdentity, key: ChunkKey, payload: bytes) -> list[bytes]:
    """Header (of the true payload) and ``payload`` as sent."""
    true_payload = chunk_pattern(key, identity.layout.chunk_bytes)
    return [codec.encode_header(identity.digest, key, true_payload), payload]


@pytest.fixture
def fetch(identity: CacheIdentity) -> Iterator[Callable[[Answer], Fetched]]:
    """Load ``n`` chunks (1) into slots 0.. (slot 0 filled with 7s) from a peer that answers with
    ``answer``."""
    closers: list[Callable[[], None]] = []

    def run(answer: Answer, n: int = 1) -> Fetched:
        peer = ScriptedPeer(answer)
        region = HostRegion(4, identity.layout.chunk_bytes)
        region.numpy(0)[:] = 7
        config = P2PTierConfig(host="127.0.0.1", port=peer.port, timeout_s=0.5)
        tier = PeerTier(config, region, identity)
        closers.extend([peer.close, tier.close])
        keys = make_keys(identity, n)
        tier.submit_load(TransferJob(1, tuple(keys), tuple(range(n))))
        return collect(tier, [1])[1], tier.stats(), region.numpy(0)

    yield run
    for close in reversed(closers):
        close()


def test_a_good_payload_lands_in_its_slot(fetch, identity):
    """The reply's payload is received into slot 0 and verified there."""

    def answer(req_id: int, keys: list[ChunkKey]) -> list[bytes]:
        good = chunk_pattern(keys[0], identity.layout.chunk_bytes)
        return [proto.encode(proto.FETCH, req_id, [True]), *chunk_frames(identity, keys[0], good)]

    result, stats, slot = fetch(answer)
    (key,) = result.succeeded
    assert not result.failed and stats["fetched_chunks"] == 1
    assert slot.tobytes() == chunk_pattern(key, len(slot))


def test_a_payload_that_lands_corrupted_is_an_integrity_failure(fetch, identity):
    """The payload lands in the slot with one byte flipped: the key fails, never succeeds."""

    def answer(req_id: int, keys: list[ChunkKey]) -> list[bytes]:
        bad = bytearray(chunk_pattern(keys[0], identity.layout.chunk_bytes))
        bad[100] ^= 1
        return [proto.encode(proto.FETCH, req_id, [True]), *chunk_frames(identity, keys[0], bad)]

    result, stats, _ = fetch(answer)
    assert not result.succeeded and result.integrity_failed == result.failed
    assert stats["integrity.checksum"] == 1


def test_each_landed_payload_is_verified_against_its_own_checksum(fetch, identity):
    """Three chunks land, the middle one corrupted and the last not found: only it fails."""

    def answer(req_id: int, keys: list[ChunkKey]) -> list[bytes]:
        payloads = [bytearray(chunk_pattern(k, identity.layout.chunk_bytes)) for k in keys[:2]]
        payloads[1][-1] ^= 1
        chunks = [f for k, p in zip(keys, payloads) for f in chunk_frames(identity, k, bytes(p))]
        return [proto.encode(proto.FETCH, req_id, [True, True, False]), *chunks]

    result, stats, slot = fetch(answer, 3)
    keys = make_keys(identity, 3)
    assert result.succeeded == {keys[0]} and result.integrity_failed == {keys[1]}
    assert result.failed == {keys[1], keys[2]}
    assert stats["integrity.checksum"] == 1 and stats["fetched_chunks"] == 1
    assert slot.tobytes() == chunk_pattern(keys[0], len(slot))


def test_a_reply_to_no_request_in_flight_never_lands(fetch, identity):
    """A reply under another request id carries a good chunk: the slot is left alone."""

    def answer(req_id: int, keys: list[ChunkKey]) -> list[bytes]:
        good = chunk_pattern(keys[0], identity.layout.chunk_bytes)
        return [
            proto.encode(proto.FETCH, req_id + 1000, [True]),
            *chunk_frames(identity, keys[0], good),
        ]

    result, stats, slot = fetch(answer)
    assert not result.succeeded
    assert stats["stale_replies"] == 1
    assert (slot == 7).all()


def test_a_payload_longer_than_its_slot_is_a_malformed_reply(fetch, identity):
    """One byte more than a chunk: cut off on receipt, the reply is dropped, the load fails."""

    def answer(req_id: int, keys: list[ChunkKey]) -> list[bytes]:
        long = chunk_pattern(keys[0], identity.layout.chunk_bytes) + b"x"
        return [proto.encode(proto.FETCH, req_id, [True]), *chunk_frames(identity, keys[0], long)]

    result, stats, _ = fetch(answer)
    assert not result.succeeded
    assert stats["malformed_replies"] == 1
