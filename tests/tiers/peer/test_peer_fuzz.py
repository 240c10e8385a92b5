"""The peer server under malformed input (hypothesis), and its slot holds.

The serving manager runs in this process, built from a config with ``serve`` (the manager's
hook), and is driven by one thread standing in for the engine's scheduler loop. Fuzz frames come
from raw ZeroMQ sockets, one that shook hands and one that did not; after each example an honest
client still fetches byte-identical chunks.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier import CacheIdentity, TieringManager
from kvtier.config import P2PTierConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import HIT, MISS, TransferJob
from kvtier.tiers.peer import protocol as proto
from kvtier.tiers.peer.tier import PeerTier
from kvtier.tiers.shared import codec
from tests.conftest import (
    SMALL_LAYOUT,
    collect,
    config,
    fill,
    holds,
    make_keys,
    on_a_free_port,
    settle_lookup,
    wait_for,
)

IDENTITY = CacheIdentity(model="test/model", revision="r1", layout=SMALL_LAYOUT)
KEYS = make_keys(IDENTITY, 8)
CHUNK = SMALL_LAYOUT.chunk_bytes
JOB_IDS = itertools.count(1)


class Served:
    """A serving manager driven by its own thread; ``call`` runs a function on that thread."""

    def __init__(self) -> None:
        def serving(port: int) -> TieringManager:
            serve = {"port": port, "accept_stores": True}
            return TieringManager(config(32, serve=serve), IDENTITY)

        self.manager, self.port = on_a_free_port(serving)
        plan = self.manager.prepare_store(KEYS)
        assert plan is not None
        for key, slot in zip(plan.keys, plan.slots):
            fill(self.manager.region, slot, key)
        self.manager.complete_store(plan.keys)
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop)
        self._thread.start()

    def _loop(self) -> None:
        server = self.manager.peer_server
        assert server is not None
        while not self._stop.is_set():
            server.wait_for_work(0.01)
            self.manager.poll()
            while not self._calls.empty():
                fn, future = self._calls.get()
                try:
                    future.set_result(fn())
                except Exception as exc:
                    future.set_exception(exc)

    def call(self, fn: Callable[[], Any]) -> Any:
        future: Future[Any] = Future()
        self._calls.put((fn, future))
        return future.result(timeout=10)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the serving loop did not stop within 30 s"
        self.manager.close()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    node = Served()
    yield node
    node.close()


@pytest.fixture(scope="module")
def honest(served: Served) -> Iterator[tuple[PeerTier, HostRegion]]:
    region = HostRegion(16, CHUNK)
    tier = PeerTier(P2PTierConfig(host="127.0.0.1", port=served.port), region, IDENTITY)
    yield tier, region
    tier.close()


@pytest.fixture(scope="module")
def sockets(served: Served) -> Iterator[dict[str, zmq.Socket[bytes]]]:
    """Raw DEALERs: ``greeted`` shook hands with the server, ``stranger`` did not."""
    context = zmq.Context()
    pair = {name: context.socket(zmq.DEALER) for name in ("greeted", "stranger")}
    for sock in pair.values():
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 10_000)
        sock.connect(f"tcp://127.0.0.1:{served.port}")
    pair["greeted"].send(proto.hello(1, IDENTITY.digest))
    assert proto.decode_reply([memoryview(pair["greeted"].recv())], CHUNK).ok
    yield pair
    context.destroy(linger=0)


def honest_fetch(tier: PeerTier, region: HostRegion, job_id: int) -> bool:
    region.numpy(0)[:] = 0
    tier.submit_load(TransferJob(job_id, tuple(KEYS[:3]), (0, 1, 2)))
    result = collect(tier, [job_id])[job_id]
    return result.ok and all(holds(region, i, key) for i, key in enumerate(KEYS[:3]))


def barrier(sock: zmq.Socket[bytes], timeout: float = 10.0) -> None:
    """A valid request answered means every earlier message from ``sock`` was handled."""
    while sock.poll(0):
        sock.recv_multipart()
    sock.send(proto.keyed(proto.LOOKUP, 424242, [KEYS[0]]))
    deadline = time.monotonic() + timeout
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        assert left_ms > 0 and sock.poll(left_ms), f"no answer to the barrier within {timeout} s"
        if msgpack.unpackb(sock.recv_multipart()[0])[1] == 424242:
            return


values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=40)
    | st.text(max_size=8) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=16,
)  # fmt: skip
kinds = st.sampled_from([proto.REFUSED, proto.HELLO, proto.LOOKUP, proto.FETCH, proto.STORE, 7, -1])
structured = st.tuples(kinds, values, values).map(lambda t: [msgpack.packb(list(t))])
random_frames = st.lists(st.binary(max_size=300), min_size=1, max_size=5)
key = st.binary(min_size=32, max_size=32)


@st.composite
def bogus_stores(draw: st.DrawFn) -> list[bytes]:
    """Well-shaped STOREs whose chunks lie: random bytes, or a header for other bytes."""
    k = draw(key)
    payload = draw(st.binary(min_size=CHUNK, max_size=CHUNK) | st.just(bytes(CHUNK)))
    other = bytes([payload[0] ^ 1]) + payload[1:]
    header_of_other = codec.encode_header(IDENTITY.digest, k, other)
    header = draw(st.sampled_from([header_of_other, bytes(codec.HEADER_BYTES)]))
    frames = [proto.keyed(proto.STORE, draw(st.integers(0, 2**63 - 1)), [k]), header, payload]
    if draw(st.booleans()):
        frames[draw(st.integers(1, 2))] = draw(st.binary(max_size=64))  # a wrong frame length
    return frames


messages = structured | random_frames | bogus_stores()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(st.tuples(st.sampled_from(["greeted", "stranger"]), messages), max_size=4))
def test_malformed_frames_never_disturb_honest_clients(served, honest, sockets, batch):
    for who, frames in batch:
        sockets[who].send_multipart(frames)
    for sock in sockets.values():
        barrier(sock)
    tier, region = honest
    assert honest_fetch(tier, region, job_id=next(JOB_IDS))


def test_the_server_counts_malformed_messages_and_survives_them(served, honest, sockets):
    """Whether or not the fuzzing ran before: malformed messages are counted, none breaks it."""
    before = served.manager.peer_server.stats().get("malformed_messages", 0)
    garbage = [[b"\xc1"], [proto.encode(proto.FETCH, 1, [b"short"])], [b"x", b"y", b"z"]]
    for who in ("greeted", "stranger"):
        for frames in garbage:
            sockets[who].send_multipart(frames)
        barrier(sockets[who])
    stats = served.manager.peer_server.stats()
    assert stats["malformed_messages"] >= before + 2 * len(garbage)
    assert stats.get("server_errors", 0) == 0
    bogus = make_keys(IDENTITY, 1, seed=31337)[0]
    frames = [
        proto.keyed(proto.STORE, 5, [bogus]),
        codec.encode_header(IDENTITY.digest, bogus, b"x" * CHUNK),
        b"y" * CHUNK,
    ]
    sockets["greeted"].send_multipart(frames)
    barrier(sockets["greeted"])
    tier, _ = honest
    assert settle_lookup(tier, bogus) is MISS, "a chunk failing verification never became visible"
    assert served.manager.peer_server.stats()["store_integrity.checksum"] >= 1


def test_a_verified_store_becomes_visible_to_other_clients(served, honest):
    tier, region = honest
    new = make_keys(IDENTITY, 1, seed=4242)[0]
    fill(region, 9, new)
    tier.submit_store(TransferJob(77, (new,), (9,)))
    assert collect(tier, [77])[77].ok
    assert settle_lookup(tier, new) is HIT


def test_served_slots_are_released_once_sent(served, honest):
    tier, region = honest
    for _ in range(5):
        assert honest_fetch(tier, region, next(JOB_IDS))
    wait_for(lambda: served.call(lambda: served.manager.host.num_held) == 0)
    assert served.manager.peer_server.stats().get("holds_expired", 0) == 0
