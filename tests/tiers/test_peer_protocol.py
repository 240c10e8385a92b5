"""Peer protocol messages: what decodes, and what is rejected as malformed (with its reason)."""

from __future__ import annotations

import msgpack
import pytest

from kvtier.tiers import peer_protocol as proto
from kvtier.tiers.codec import HEADER_BYTES

CHUNK = 64
KEY = bytes(range(32))


def views(*frames: bytes) -> list[memoryview]:
    return [memoryview(f) for f in frames]


def test_requests_round_trip():
    hello = proto.decode_request(views(proto.hello(3, KEY)), CHUNK)
    assert hello == proto.Hello(3, proto.PROTOCOL_VERSION, KEY)
    fetch = proto.decode_request(views(proto.keyed(proto.FETCH, 4, [KEY, KEY])), CHUNK)
    assert isinstance(fetch, proto.Request) and fetch.keys == (KEY, KEY) and fetch.chunks == ()
    store = proto.keyed(proto.STORE, 5, [KEY])
    request = proto.decode_request(views(store, bytes(HEADER_BYTES), bytes(CHUNK)), CHUNK)
    assert isinstance(request, proto.Request) and len(request.chunks) == 1


def test_a_fetch_reply_carries_two_frames_per_found_key():
    meta = proto.encode(proto.FETCH, 9, [True, False, True])
    chunk = (bytes(HEADER_BYTES), bytes(CHUNK))
    reply = proto.decode_reply(views(meta, *chunk, *chunk), CHUNK)
    assert isinstance(reply, proto.Reply) and reply.flags == (True, False, True)
    assert len(reply.chunks) == 2
    with pytest.raises(proto.ProtocolError):
        proto.decode_reply(views(meta, *chunk), CHUNK)


def test_a_lookup_reply_says_held_coming_or_missing():
    meta = proto.encode(proto.LOOKUP, 2, [proto.HELD, proto.COMING, proto.MISSING])
    reply = proto.decode_reply(views(meta), CHUNK)
    assert isinstance(reply, proto.Reply) and reply.flags == (True, False, False)
    assert reply.states == (proto.HELD, proto.COMING, proto.MISSING)


@pytest.mark.parametrize("body", [[3], [True], ["1"], [-1], None])
def test_lookup_replies_with_other_states_are_rejected(body):
    with pytest.raises(proto.ProtocolError):
        proto.decode_reply(views(proto.encode(proto.LOOKUP, 2, body)), CHUNK)
    with pytest.raises(proto.ProtocolError):
        proto.decode_reply(views(proto.encode(proto.LOOKUP, 2, [1]), b"extra"), CHUNK)


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([b"\xc1"], "undecodable"),
        ([msgpack.packb({"a": 1})], "undecodable"),
        ([msgpack.packb([1, 2])], "not [kind, req_id, body]"),
        ([msgpack.packb([proto.FETCH, "1", [KEY]])], "integers"),
        ([msgpack.packb([proto.FETCH, -1, [KEY]])], "req_id"),
        ([msgpack.packb([42, 1, [KEY]])], "unknown request kind"),
        ([msgpack.packb([proto.FETCH, 1, [KEY[:31]]])], "keys must be 32 bytes"),
        ([msgpack.packb([proto.FETCH, 1, []])], "key list"),
        ([msgpack.packb([proto.FETCH, 1, [KEY] * (proto.MAX_KEYS + 1)])], "undecodable"),
        ([msgpack.packb([proto.STORE, 1, [KEY]]), bytes(HEADER_BYTES)], "frames for 1 chunks"),
        ([msgpack.packb([proto.STORE, 1, [KEY]]), b"h", bytes(CHUNK)], "header frame length"),
        ([msgpack.packb([proto.STORE, 1, [KEY]]), bytes(HEADER_BYTES), b"p"], "payload frame"),
        ([msgpack.packb([proto.HELLO, 1, [1, KEY]]), b"extra"], "hello carries no frames"),
        ([bytes(proto.MAX_META_BYTES + 1)], "oversized"),
    ],
)
def test_malformed_requests_are_rejected_with_a_reason(frames, reason):
    with pytest.raises(proto.ProtocolError) as caught:
        proto.decode_request(views(*frames), CHUNK)
    assert reason in caught.value.reason
