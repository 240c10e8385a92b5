"""Peer protocol messages: what decodes, and what is rejected as malformed (with its reason).

Every decoder is checked field by field against a model written from the protocol's description
(every field swapped for every type of value), and fuzzed against it (hypothesis)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.keys import KEY_BYTES
from kvtier.tiers.peer import protocol as proto
from kvtier.tiers.shared.codec import HEADER_BYTES

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


# -- every decoder, every field: what is not exactly the protocol is rejected ------------------
HEADER, PAYLOAD = bytes(HEADER_BYTES), bytes(CHUNK)
DIGEST = bytes(range(100, 132))


def meta(kind: object, req_id: object, body: object) -> bytes:
    packed: bytes = msgpack.packb([kind, req_id, body], use_bin_type=True)
    return packed


VALID_REQUESTS = {
    "hello": [meta(proto.HELLO, 1, [proto.PROTOCOL_VERSION, DIGEST])],
    "lookup": [meta(proto.LOOKUP, 1, [KEY])],
    "fetch": [meta(proto.FETCH, 1, [KEY, KEY])],
    "store": [meta(proto.STORE, 1, [KEY]), HEADER, PAYLOAD],
}

BAD_REQUESTS = {
    # metadata: [kind, req_id, body], integers in range
    "meta is a map": [msgpack.packb({"kind": 1})],
    "meta has 4 items": [msgpack.packb([proto.LOOKUP, 1, [KEY], 0])],
    "meta has 2 items": [msgpack.packb([proto.LOOKUP, 1])],
    "kind is a bool": [meta(True, 1, [proto.PROTOCOL_VERSION, DIGEST])],
    "kind is a float": [meta(2.0, 1, [KEY])],
    "kind is a str": [meta("2", 1, [KEY])],
    "kind is None": [meta(None, 1, [KEY])],
    "unknown kind": [meta(5, 1, [KEY])],
    "negative kind": [meta(-2, 1, [KEY])],
    "req_id is a bool": [meta(proto.LOOKUP, True, [KEY])],
    "req_id is a float": [meta(proto.LOOKUP, 1.0, [KEY])],
    "req_id is bytes": [meta(proto.LOOKUP, b"\x01", [KEY])],
    "req_id above range": [meta(proto.LOOKUP, proto.MAX_REQ_ID + 1, [KEY])],
    "req_id negative": [meta(proto.LOOKUP, -1, [KEY])],
    "a REFUSED request": [meta(proto.REFUSED, 1, "no")],
    "no frames": [],
    "too many frames": [meta(proto.STORE, 1, [KEY])] + [HEADER, PAYLOAD] * (proto.MAX_KEYS + 1),
    # HELLO [version, identity digest]
    "hello version is a bool": [meta(proto.HELLO, 1, [True, DIGEST])],
    "hello version is a float": [meta(proto.HELLO, 1, [2.0, DIGEST])],
    "hello version is a str": [meta(proto.HELLO, 1, ["2", DIGEST])],
    "hello version is None": [meta(proto.HELLO, 1, [None, DIGEST])],
    "hello identity is a str": [meta(proto.HELLO, 1, [2, DIGEST.hex()[:32]])],
    "hello identity is short": [meta(proto.HELLO, 1, [2, DIGEST[:31]])],
    "hello identity is long": [meta(proto.HELLO, 1, [2, DIGEST + b"x"])],
    "hello identity is a list": [meta(proto.HELLO, 1, [2, list(DIGEST)])],
    "hello field missing": [meta(proto.HELLO, 1, [2])],
    "hello field extra": [meta(proto.HELLO, 1, [2, DIGEST, True])],
    "hello body is a map": [meta(proto.HELLO, 1, {"version": 2})],
    "hello body is bytes": [meta(proto.HELLO, 1, DIGEST)],
    "hello with a frame": [meta(proto.HELLO, 1, [2, DIGEST]), HEADER],
    # LOOKUP / FETCH / STORE [key, ...]
    "lookup key is a str": [meta(proto.LOOKUP, 1, [KEY.hex()[:32]])],
    "lookup key is an int": [meta(proto.LOOKUP, 1, [7])],
    "lookup key is short": [meta(proto.LOOKUP, 1, [KEY[:31]])],
    "lookup key is long": [meta(proto.LOOKUP, 1, [KEY + b"x"])],
    "lookup keys not a list": [meta(proto.LOOKUP, 1, KEY)],
    "lookup keys empty": [meta(proto.LOOKUP, 1, [])],
    "lookup keys nested": [meta(proto.LOOKUP, 1, [[KEY]])],
    "lookup one bad key among good": [meta(proto.LOOKUP, 1, [KEY, KEY, None])],
    "lookup with frames": [meta(proto.LOOKUP, 1, [KEY]), HEADER, PAYLOAD],
    "fetch key is a bool": [meta(proto.FETCH, 1, [True])],
    "fetch with frames": [meta(proto.FETCH, 1, [KEY]), HEADER, PAYLOAD],
    "fetch too many keys": [meta(proto.FETCH, 1, [KEY] * (proto.MAX_KEYS + 1))],
    "store without chunks": [meta(proto.STORE, 1, [KEY])],
    "store missing a chunk": [meta(proto.STORE, 1, [KEY, KEY]), HEADER, PAYLOAD],
    "store an extra chunk": [meta(proto.STORE, 1, [KEY]), HEADER, PAYLOAD, HEADER, PAYLOAD],
    "store an odd frame": [meta(proto.STORE, 1, [KEY]), HEADER, PAYLOAD, HEADER],
    "store short header": [meta(proto.STORE, 1, [KEY]), HEADER[:-1], PAYLOAD],
    "store long payload": [meta(proto.STORE, 1, [KEY]), HEADER, PAYLOAD + b"x"],
    "store frames swapped": [meta(proto.STORE, 1, [KEY]), PAYLOAD, HEADER],
}


@pytest.mark.parametrize("name", VALID_REQUESTS)
def test_each_valid_request_decodes(name):
    message = proto.decode_request(views(*VALID_REQUESTS[name]), CHUNK)
    assert message.req_id == 1


@pytest.mark.parametrize("name", BAD_REQUESTS)
def test_each_malformed_request_is_rejected(name):
    with pytest.raises(proto.ProtocolError):
        proto.decode_request(views(*BAD_REQUESTS[name]), CHUNK)


VALID_REPLIES = {
    "refused": [meta(proto.REFUSED, 1, "hello first")],
    "refused, empty reason": [meta(proto.REFUSED, 1, "")],
    "hello ok": [meta(proto.HELLO, 1, [True, False, ""])],
    "hello refused": [meta(proto.HELLO, 1, [False, False, "x" * proto.MAX_REASON_CHARS])],
    "lookup": [meta(proto.LOOKUP, 1, [proto.MISSING, proto.HELD, proto.COMING])],
    "fetch": [meta(proto.FETCH, 1, [False, True]), HEADER, PAYLOAD],
    "fetch nothing found": [meta(proto.FETCH, 1, [False])],
    "store": [meta(proto.STORE, 1, [True, False])],
}

BAD_REPLIES = {
    "unknown kind": [meta(9, 1, [True])],
    "kind is a bool": [meta(False, 1, "no")],
    "req_id above range": [meta(proto.STORE, proto.MAX_REQ_ID + 1, [True])],
    # REFUSED reason
    "refused reason is bytes": [meta(proto.REFUSED, 1, b"no")],
    "refused reason is an int": [meta(proto.REFUSED, 1, 0)],
    "refused reason is None": [meta(proto.REFUSED, 1, None)],
    "refused reason is a list": [meta(proto.REFUSED, 1, ["no"])],
    "refused reason too long": [meta(proto.REFUSED, 1, "x" * (proto.MAX_REASON_CHARS + 1))],
    "refused with a frame": [meta(proto.REFUSED, 1, "no"), HEADER],
    # HELLO reply [ok, accepts_stores, reason]
    "hello ok is an int": [meta(proto.HELLO, 1, [1, False, ""])],
    "hello ok is zero": [meta(proto.HELLO, 1, [0, False, ""])],
    "hello accepts_stores is an int": [meta(proto.HELLO, 1, [True, 1, ""])],
    "hello ok is a str": [meta(proto.HELLO, 1, ["true", False, ""])],
    "hello ok is None": [meta(proto.HELLO, 1, [None, False, ""])],
    "hello reason is bytes": [meta(proto.HELLO, 1, [True, False, b""])],
    "hello reason is an int": [meta(proto.HELLO, 1, [True, False, 0])],
    "hello reason is None": [meta(proto.HELLO, 1, [True, False, None])],
    "hello reason too long": [meta(proto.HELLO, 1, [False, False, "x" * 257])],
    "hello field missing": [meta(proto.HELLO, 1, [True, False])],
    "hello field extra": [meta(proto.HELLO, 1, [True, False, "", True])],
    "hello body is a str": [meta(proto.HELLO, 1, "ok")],
    "hello body is a bool": [meta(proto.HELLO, 1, True)],
    "hello with a frame": [meta(proto.HELLO, 1, [True, False, ""]), HEADER],
    # LOOKUP reply [state, ...]
    "lookup state is a bool": [meta(proto.LOOKUP, 1, [True])],
    "lookup state out of range": [meta(proto.LOOKUP, 1, [3])],
    "lookup state negative": [meta(proto.LOOKUP, 1, [-1])],
    "lookup state is a float": [meta(proto.LOOKUP, 1, [1.0])],
    "lookup state is a str": [meta(proto.LOOKUP, 1, ["1"])],
    "lookup body is an int": [meta(proto.LOOKUP, 1, 1)],
    "lookup with frames": [meta(proto.LOOKUP, 1, [proto.HELD]), HEADER, PAYLOAD],
    # FETCH reply [found?, ...] + 2 frames per found key
    "fetch flag is an int": [meta(proto.FETCH, 1, [1]), HEADER, PAYLOAD],
    "fetch flag is zero": [meta(proto.FETCH, 1, [0])],
    "fetch flag is None": [meta(proto.FETCH, 1, [None])],
    "fetch flags not a list": [meta(proto.FETCH, 1, True), HEADER, PAYLOAD],
    "fetch missing chunk": [meta(proto.FETCH, 1, [True, True]), HEADER, PAYLOAD],
    "fetch extra chunk": [meta(proto.FETCH, 1, [True, False]), HEADER, PAYLOAD, HEADER, PAYLOAD],
    "fetch chunk for no flag": [meta(proto.FETCH, 1, [False]), HEADER, PAYLOAD],
    "fetch short payload": [meta(proto.FETCH, 1, [True]), HEADER, PAYLOAD[:-1]],
    "fetch long header": [meta(proto.FETCH, 1, [True]), HEADER + b"x", PAYLOAD],
    # STORE reply [stored?, ...]
    "store flag is an int": [meta(proto.STORE, 1, [1])],
    "store flag is a str": [meta(proto.STORE, 1, ["yes"])],
    "store flags not a list": [meta(proto.STORE, 1, True)],
    "store with frames": [meta(proto.STORE, 1, [True]), HEADER, PAYLOAD],
}


@pytest.mark.parametrize("name", VALID_REPLIES)
def test_each_valid_reply_decodes(name):
    assert proto.decode_reply(views(*VALID_REPLIES[name]), CHUNK).req_id == 1


@pytest.mark.parametrize("name", BAD_REPLIES)
def test_each_malformed_reply_is_rejected(name):
    with pytest.raises(proto.ProtocolError):
        proto.decode_reply(views(*BAD_REPLIES[name]), CHUNK)


def test_decoded_replies_carry_exactly_what_was_sent():
    hello = proto.decode_reply(views(meta(proto.HELLO, 7, [True, False, "why"])), CHUNK)
    assert hello == proto.HelloReply(7, True, False, "why")
    assert type(hello.ok) is bool and type(hello.accepts_stores) is bool
    refused = proto.decode_reply(views(meta(proto.REFUSED, 8, "hello first")), CHUNK)
    assert refused == proto.Refused(8, "hello first")
    store = proto.decode_reply(views(meta(proto.STORE, 9, [True, False])), CHUNK)
    assert store == proto.Reply(proto.STORE, 9, (True, False))
    assert all(type(flag) is bool for flag in store.flags)


@pytest.mark.parametrize(
    ("body", "expected"),
    [([True, False], (5, [True, False])), ([1], None), ([None], None), (True, None)],
)
def test_fetch_flags_reads_only_fetch_replies_with_bool_flags(body, expected):
    assert proto.fetch_flags(memoryview(meta(proto.FETCH, 5, body))) == expected
    assert proto.fetch_flags(memoryview(meta(proto.STORE, 5, [True]))) is None
    assert proto.fetch_flags(memoryview(b"\xc1")) is None


# -- the decoders against a model written from the protocol's description (hypothesis) --------
def fits_unpacking_limits(value: object) -> bool:
    """What ``_meta``'s msgpack limits let through: small bins and strs, no maps, no big lists."""
    if isinstance(value, bytes):
        return len(value) <= KEY_BYTES
    if isinstance(value, str):
        return len(value.encode()) <= proto.MAX_REASON_CHARS
    if isinstance(value, dict):
        return not value
    if isinstance(value, list):
        return len(value) <= proto.MAX_KEYS and all(fits_unpacking_limits(v) for v in value)
    return True


def is_int(value: object) -> bool:
    return type(value) is int


def is_flags(body: object) -> bool:
    return isinstance(body, list) and all(type(f) is bool for f in body)


def chunks_ok(frames: list[bytes], count: int) -> bool:
    rest = frames[1:]
    return len(rest) == 2 * count and all(
        len(f) == (HEADER_BYTES if i % 2 == 0 else CHUNK) for i, f in enumerate(rest)
    )


def model_request(value: object, frames: list[bytes]) -> bool:
    """Whether the protocol (module docstring) accepts ``frames`` as a request."""
    if not fits_unpacking_limits(value) or not isinstance(value, list) or len(value) != 3:
        return False
    kind, req_id, body = value
    if not (is_int(kind) and is_int(req_id) and 0 <= req_id <= proto.MAX_REQ_ID):
        return False
    if kind == proto.HELLO:
        return (
            len(frames) == 1
            and isinstance(body, list)
            and len(body) == 2
            and is_int(body[0])
            and type(body[1]) is bytes
            and len(body[1]) == KEY_BYTES
        )
    if kind not in (proto.LOOKUP, proto.FETCH, proto.STORE):
        return False
    keys_ok = isinstance(body, list) and 0 < len(body) <= proto.MAX_KEYS
    keys_ok = keys_ok and all(type(k) is bytes and len(k) == KEY_BYTES for k in body)
    return keys_ok and chunks_ok(frames, len(body) if kind == proto.STORE else 0)


def model_reply(value: object, frames: list[bytes]) -> bool:
    """Whether the protocol (module docstring) accepts ``frames`` as a reply."""
    if not fits_unpacking_limits(value) or not isinstance(value, list) or len(value) != 3:
        return False
    kind, req_id, body = value
    if not (is_int(kind) and is_int(req_id) and 0 <= req_id <= proto.MAX_REQ_ID):
        return False
    reason_ok = type(body) is str and len(body) <= proto.MAX_REASON_CHARS
    if kind == proto.REFUSED:
        return len(frames) == 1 and reason_ok
    if kind == proto.HELLO:
        if len(frames) != 1 or not isinstance(body, list) or len(body) != 3:
            return False
        ok, accepts, reason = body
        return type(ok) is bool and type(accepts) is bool and type(reason) is str
    if kind == proto.LOOKUP:
        states = (proto.MISSING, proto.HELD, proto.COMING)
        return (
            len(frames) == 1
            and isinstance(body, list)
            and all(is_int(s) and s in states for s in body)
        )
    if kind == proto.FETCH:
        return is_flags(body) and chunks_ok(frames, sum(body))
    if kind == proto.STORE:
        return is_flags(body) and len(frames) == 1
    return False


DECODERS = {
    "request": (proto.decode_request, model_request),
    "reply": (proto.decode_reply, model_reply),
}


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 5)
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.binary(max_size=40)
    | st.sampled_from([KEY, DIGEST, KEY[:31], KEY + b"x"])
    | st.text(max_size=6)
    | st.sampled_from(["", "x" * proto.MAX_REASON_CHARS, "x" * (proto.MAX_REASON_CHARS + 1)])
)
anything = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=8,
)
flags = st.lists(st.booleans(), max_size=4)
bodies = st.one_of(
    anything,
    st.lists(st.sampled_from([KEY, DIGEST]), min_size=1, max_size=3),  # keys
    st.lists(scalars, min_size=1, max_size=3),
    flags,
    st.lists(st.sampled_from([proto.MISSING, proto.HELD, proto.COMING]), max_size=3),
    st.tuples(st.integers(0, 3) | scalars, st.sampled_from([DIGEST, KEY]) | scalars).map(list),
    st.tuples(st.booleans() | scalars, st.booleans() | scalars, st.text(max_size=4) | scalars).map(
        list
    ),
    st.text(max_size=8),
)
kinds = st.sampled_from([proto.REFUSED, proto.HELLO, proto.LOOKUP, proto.FETCH, proto.STORE])
chunk_frame = st.sampled_from([HEADER, PAYLOAD, b"", HEADER[:-1], PAYLOAD + b"x"])


def frames_for(body: object) -> list[list[bytes]]:
    """Chunk frames a message with ``body`` might carry: none, one chunk per item (a STORE
    request) or one per true flag (a FETCH reply)."""
    items = body if isinstance(body, list) else []
    return [[], [HEADER, PAYLOAD] * len(items), [HEADER, PAYLOAD] * items.count(True)]


@st.composite
def far_messages(draw: st.DrawFn) -> tuple[object, list[bytes]]:
    """``(metadata value, frames)`` with any kind, req_id and body."""
    kind = draw(kinds | scalars)
    req_id = draw(st.integers(0, 5) | st.sampled_from([proto.MAX_REQ_ID, -1]) | scalars)
    body = draw(bodies)
    value: object = [kind, req_id, body]
    if draw(st.integers(0, 9)) == 0:
        value = draw(st.sampled_from([[kind, req_id], [kind, req_id, body, 0], body]))
    extra = draw(st.sampled_from(frames_for(body)) | st.lists(chunk_frame, max_size=4))
    return value, [msgpack.packb(value, use_bin_type=True), *extra]


#: Valid bodies by kind: (request body, reply body).
TEMPLATES = {
    proto.HELLO: ([proto.PROTOCOL_VERSION, DIGEST], [True, True, ""]),
    proto.LOOKUP: ([KEY, KEY], [proto.HELD, proto.COMING]),
    proto.FETCH: ([KEY, KEY], [True, False]),
    proto.STORE: ([KEY], [True, False]),
    proto.REFUSED: ("hello first", "hello first"),
}


@st.composite
def near_messages(draw: st.DrawFn) -> tuple[object, list[bytes]]:
    """A valid request or reply with at most one field changed, dropped or added, and its
    frames as they should be or with one frame dropped, added or changed."""
    kind = draw(kinds)
    body: object = list(draw(st.sampled_from(TEMPLATES[kind]))) if kind else "hello first"
    if isinstance(body, list) and body:
        index = draw(st.integers(0, len(body) - 1))
        change = draw(st.sampled_from(["keep", "replace", "drop", "add"]))
        if change == "replace":
            body[index] = draw(scalars)
        elif change == "drop":
            del body[index]
        elif change == "add":
            body.insert(index, draw(scalars))
    elif draw(st.booleans()):
        body = draw(scalars)
    value = [kind, draw(st.integers(0, 5)), body]
    extra = list(draw(st.sampled_from(frames_for(body))))
    change = draw(st.sampled_from(["keep", "keep", "drop", "add", "replace"]))
    if change == "add":
        extra.insert(draw(st.integers(0, len(extra))), draw(chunk_frame))
    elif extra and change in ("drop", "replace"):
        index = draw(st.integers(0, len(extra) - 1))
        if change == "drop":
            del extra[index]
        else:
            extra[index] = draw(chunk_frame)
    return value, [msgpack.packb(value, use_bin_type=True), *extra]


#: Values of every msgpack type, for every field: ints that are bools, bools that are ints, strs
#: that are bytes, and so on.
CONFUSIONS = [
    True,
    False,
    0,
    1,
    2,
    3,
    -1,
    2**63,
    1.0,
    None,
    "",
    "x",
    b"",
    b"x",
    KEY,
    DIGEST,
    KEY[:31],
    [],
    [KEY],
    [True],
    {},
]


def chunk_frames(direction: str, kind: int, body: object) -> list[bytes]:
    """The chunk frames a message would carry if ``body`` were valid."""
    items = body if isinstance(body, list) else []
    if direction == "request" and kind == proto.STORE:
        return [HEADER, PAYLOAD] * len(items)
    if direction == "reply" and kind == proto.FETCH:
        return [HEADER, PAYLOAD] * sum(1 for item in items if item is True)
    return []


def variants(body: object) -> list[object]:
    """``body`` with each field, in turn, replaced by each confusion, dropped, or one added."""
    out: list[object] = [*CONFUSIONS]
    if isinstance(body, list):
        for index in range(len(body)):
            out += [[*body[:index], value, *body[index + 1 :]] for value in CONFUSIONS]
            out.append([*body[:index], *body[index + 1 :]])
        out += [[*body, value] for value in CONFUSIONS]
    return out


def test_every_field_of_every_message_against_every_type_of_value():
    """Each decoder agrees with the model on every single-field change of every valid message."""
    checked = 0
    for kind, bodies_by_direction in TEMPLATES.items():
        for direction, template in zip(("request", "reply"), bodies_by_direction, strict=True):
            decode, model = DECODERS[direction]
            for body in [template, *variants(template)]:
                value = [kind, 3, body]
                frames = [meta(*value), *chunk_frames(direction, kind, body)]
                try:
                    decode(views(*frames), CHUNK)
                    accepted = True
                except proto.ProtocolError:
                    accepted = False
                assert accepted == model(value, frames), f"{direction} {value!r}"
                checked += 1
    assert checked > 500


@settings(max_examples=600, deadline=None)
@given(near_messages() | far_messages())
def test_decoders_accept_exactly_what_the_protocol_allows(message):
    value, frames = message
    for decode, model in ((proto.decode_request, model_request), (proto.decode_reply, model_reply)):
        try:
            decoded = decode(views(*frames), CHUNK)
        except proto.ProtocolError:
            assert not model(value, frames), f"{decode.__name__} rejected a valid {value!r}"
            continue
        assert model(value, frames), f"{decode.__name__} accepted {value!r}"
        assert isinstance(value, list) and decoded.req_id == value[1]
