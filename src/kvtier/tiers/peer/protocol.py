"""The peer protocol: message shapes, encoding, and strict validation of everything received.

Every message is a list of frames. Frame 0 is a msgpack array ``[kind, req_id, body]``; chunk
bytes never go through msgpack but follow as frames of their own, two per chunk: the 4096-byte
header of ``codec`` and the payload, so a payload frame can be sent straight from a host slot
and verified where it lands. Requests (client → server):

* ``HELLO  [version, identity digest]``            reply ``[ok, accepts_stores, reason]``
* ``LOOKUP [key, ...]``                             reply ``[state, ...]``: ``MISSING``, ``HELD``
  (ready in the server's host memory now) or ``COMING`` (a tier of the server's holds it and it
  is being brought into host memory: ask again soon)
* ``FETCH  [key, ...]``                             reply ``[found?, ...]`` + 2 frames per found key
* ``STORE  [key, ...]`` + 2 frames per key          reply ``[stored?, ...]``

A server answers a well-formed request from a client that has not shaken hands with
``REFUSED reason``. A STORE carries at most ``max_store_keys(chunk_bytes)`` chunks (about
``MAX_STORE_BYTES``), so that a server can bound what one message may make it buffer; a client
splits bigger stores. A server that does not accept stores (its HELLO reply says so) takes
single-frame requests only; clients never send it a STORE. Anything else that does not match
these shapes exactly (types, counts, key and frame lengths) raises ``ProtocolError``; the
receiver drops the message and counts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from kvtier.keys import KEY_BYTES, ChunkKey
from kvtier.tiers.peer.transport import MessageLimits
from kvtier.tiers.shared.codec import HEADER_BYTES

PROTOCOL_VERSION = 2
REFUSED, HELLO, LOOKUP, FETCH, STORE = 0, 1, 2, 3, 4
#: A LOOKUP reply's answer for one key.
MISSING, HELD, COMING = 0, 1, 2
LOOKUP_STATES = (MISSING, HELD, COMING)
KEYED_KINDS = (LOOKUP, FETCH, STORE)
#: Bounds on what a peer may send; anything larger is malformed.
MAX_KEYS = 1024
MAX_META_BYTES = 64 << 10
MAX_REASON_CHARS = 256
MAX_REQ_ID = (1 << 63) - 1
#: Payload bytes of one STORE message; a chunk bigger than this travels alone.
MAX_STORE_BYTES = 8 << 20
#: Payload bytes one FETCH asks for; a chunk bigger than this is fetched alone.
FETCH_BATCH_BYTES = 32 << 20
#: Requests a client keeps out to one peer at most; a server may answer no more at once.
MAX_IN_FLIGHT = 8

Chunk = tuple[memoryview, memoryview]  # (codec header, payload)


class ProtocolError(ValueError):
    """A message that does not follow the protocol; ``reason`` names what was wrong."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Hello:
    req_id: int
    version: int
    identity: bytes


@dataclass(frozen=True)
class Request:
    """A LOOKUP, FETCH or STORE; ``chunks[i]`` belongs to ``keys[i]`` (STORE only)."""

    kind: int
    req_id: int
    keys: tuple[ChunkKey, ...]
    chunks: tuple[Chunk, ...] = ()


@dataclass(frozen=True)
class HelloReply:
    req_id: int
    ok: bool
    accepts_stores: bool
    reason: str


@dataclass(frozen=True)
class Reply:
    """Answer to a keyed request: one flag per key; FETCH adds a chunk per true flag, in order.

    A LOOKUP reply also has ``states`` (one of ``LOOKUP_STATES`` per key); its flags say HELD.
    """

    kind: int
    req_id: int
    flags: tuple[bool, ...]
    chunks: tuple[Chunk, ...] = ()
    states: tuple[int, ...] = ()


@dataclass(frozen=True)
class Refused:
    req_id: int
    reason: str


def max_store_keys(chunk_bytes: int) -> int:
    """How many chunks of ``chunk_bytes`` one STORE message may carry (at least one)."""
    return max(1, min(MAX_KEYS, MAX_STORE_BYTES // (chunk_bytes + HEADER_BYTES)))


def fetch_batch(chunk_bytes: int) -> int:
    """How many chunks of ``chunk_bytes`` one FETCH asks for (at least one)."""
    return max(1, min(MAX_KEYS, FETCH_BATCH_BYTES // chunk_bytes))


def reply_limits(chunk_bytes: int) -> MessageLimits:
    """What one reply a client takes may be: metadata, then a header and a payload for each
    chunk of one FETCH (every other reply is metadata alone)."""
    keys = fetch_batch(chunk_bytes)
    frame = max(chunk_bytes, MAX_META_BYTES)
    return MessageLimits(frame, 1 + 2 * keys, MAX_META_BYTES + keys * (HEADER_BYTES + chunk_bytes))


# -- encoding ---------------------------------------------------------------------------------
def encode(kind: int, req_id: int, body: Any) -> bytes:
    """Frame 0 of a message."""
    packed: bytes = msgpack.packb([kind, req_id, body], use_bin_type=True)
    return packed


def hello(req_id: int, identity: bytes) -> bytes:
    return encode(HELLO, req_id, [PROTOCOL_VERSION, identity])


def keyed(kind: int, req_id: int, keys: Sequence[bytes]) -> bytes:
    return encode(kind, req_id, [bytes(k) for k in keys])


# -- decoding ---------------------------------------------------------------------------------
def decode_request(frames: Sequence[memoryview], chunk_bytes: int) -> Hello | Request:
    """Validate a client's message; raises ``ProtocolError``."""
    kind, req_id, body = _meta(frames)
    if kind == HELLO:
        _expect(len(frames) == 1, "hello carries no frames")
        _expect(isinstance(body, list) and len(body) == 2, "hello body")
        version, identity = body
        _expect(_is_int(version) and _is_key(identity), "hello fields")
        return Hello(req_id, version, identity)
    _expect(kind in KEYED_KINDS, f"unknown request kind {kind!r}")
    keys = _keys(body)
    num_chunks = len(keys) if kind == STORE else 0
    chunks = _chunks(frames, num_chunks, chunk_bytes)
    return Request(kind, req_id, keys, chunks)


def decode_reply(frames: Sequence[memoryview], chunk_bytes: int) -> HelloReply | Reply | Refused:
    """Validate a server's message; raises ``ProtocolError``."""
    kind, req_id, body = _meta(frames)
    if kind == REFUSED:
        _expect(len(frames) == 1 and _is_reason(body), "refusal")
        return Refused(req_id, body)
    if kind == HELLO:
        _expect(len(frames) == 1 and isinstance(body, list) and len(body) == 3, "hello reply")
        ok, accepts_stores, reason = body
        _expect(_is_bool(ok) and _is_bool(accepts_stores) and _is_reason(reason), "hello fields")
        return HelloReply(req_id, ok, accepts_stores, reason)
    _expect(kind in KEYED_KINDS, f"unknown reply kind {kind!r}")
    if kind == LOOKUP:
        _expect(len(frames) == 1 and isinstance(body, list), "lookup reply")
        _expect(all(_is_int(s) and s in LOOKUP_STATES for s in body), "lookup states")
        return Reply(kind, req_id, tuple(s == HELD for s in body), states=tuple(body))
    _expect(isinstance(body, list) and all(_is_bool(f) for f in body), "flags")
    num_chunks = sum(body) if kind == FETCH else 0
    return Reply(kind, req_id, tuple(body), _chunks(frames, num_chunks, chunk_bytes))


def fetch_flags(meta: memoryview) -> tuple[int, list[bool]] | None:
    """``(req_id, flags)`` when ``meta`` is frame 0 of a FETCH reply, else ``None``.

    Read before the chunk frames arrive, to choose where they land; the whole message is still
    validated by ``decode_reply`` afterwards.
    """
    try:
        kind, req_id, body = _meta([meta])
    except ProtocolError:
        return None
    if kind != FETCH or not isinstance(body, list) or not all(_is_bool(f) for f in body):
        return None
    return req_id, body


def _meta(frames: Sequence[memoryview]) -> tuple[int, int, Any]:
    _expect(1 <= len(frames) <= 1 + 2 * MAX_KEYS, f"{len(frames)} frames")
    _expect(len(frames[0]) <= MAX_META_BYTES, "oversized metadata frame")
    try:
        meta = msgpack.unpackb(
            frames[0],
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_bin_len=KEY_BYTES,
            max_str_len=MAX_REASON_CHARS,
            max_array_len=MAX_KEYS,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types for garbage; all mean "malformed"
        raise ProtocolError(f"undecodable metadata ({type(exc).__name__})") from None
    _expect(isinstance(meta, list) and len(meta) == 3, "metadata is not [kind, req_id, body]")
    kind, req_id, body = meta
    _expect(_is_int(kind) and _is_int(req_id), "kind and req_id must be integers")
    _expect(0 <= req_id <= MAX_REQ_ID, "req_id out of range")
    return kind, req_id, body


def _keys(body: Any) -> tuple[ChunkKey, ...]:
    _expect(isinstance(body, list) and 0 < len(body) <= MAX_KEYS, "key list")
    _expect(all(_is_key(k) for k in body), f"keys must be {KEY_BYTES} bytes")
    return tuple(ChunkKey(k) for k in body)


def _chunks(frames: Sequence[memoryview], count: int, chunk_bytes: int) -> tuple[Chunk, ...]:
    _expect(len(frames) == 1 + 2 * count, f"{len(frames)} frames for {count} chunks")
    pairs = tuple((frames[i], frames[i + 1]) for i in range(1, len(frames), 2))
    for header, payload in pairs:
        _expect(len(header) == HEADER_BYTES, "chunk header frame length")
        _expect(len(payload) == chunk_bytes, "chunk payload frame length")
    return pairs


def _is_key(value: Any) -> bool:
    return type(value) is bytes and len(value) == KEY_BYTES


def _is_int(value: Any) -> bool:
    return type(value) is int  # not isinstance: a bool is an int to Python, not to the protocol


def _is_bool(value: Any) -> bool:
    return type(value) is bool


def _is_reason(value: Any) -> bool:
    return type(value) is str and len(value) <= MAX_REASON_CHARS


def _expect(condition: bool, reason: str) -> None:
    if not condition:
        raise ProtocolError(reason)
