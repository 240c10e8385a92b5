"""``kvtier trace from-events``: a trace from a capture of KV events in vLLM's format.

**Capture format.** A file of msgpack ``KVEventBatch`` payloads, concatenated: the third frame
(``payload``) of each ZeroMQ message ``[topic, seq, payload]`` a KV event publisher sends (vLLM's
own, or kvtier's ``kv_events``), appended to the file as is. For example::

    sock = zmq.Context().socket(zmq.SUB); sock.connect("tcp://engine:5557"); sock.subscribe(b"")
    with open("capture.msgpack", "ab") as out:
        while True:
            out.write(sock.recv_multipart()[2])

A batch is ``[ts, [event, ...], ...]``; an event is a tagged map (``{"type": "BlockStored",
...}``) or vLLM's tagged array ``["BlockStored", block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium, ...]``. Block hashes may be bytes (the trace keeps their first 8
bytes) or integers.

**Requests.** KV events record stores, not requests: each ``BlockStored`` event of the chosen
medium (``GPU`` by default: the engine computed those blocks) becomes a request whose prompt is
the chain of its blocks' ancestors (from the ``parent_block_hash`` links seen so far) plus the
new blocks, arriving at the batch's ``ts``. An event whose parent is the last block of a request
stored less than ``merge_within`` seconds earlier continues that request (chunked prefill,
decode) instead. So: a request served entirely from cache stores nothing and is missing, and
prefixes stored before the capture began are cut at the first unknown parent; the reuse a
converted trace shows is a lower bound. Events without parent links (kvtier's own events) give
one-chunk requests and say little about prefixes.

Holds the converted requests in memory; runs on the caller's thread.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import IO, Any

from kvtier.plan.cost import PlanInputError
from kvtier.plan.trace import TraceWriter, key_of

MAX_CHAIN = 1 << 20


@dataclass
class _Request:
    t: float
    keys: list[int]


@dataclass
class Converter:
    """Turns events into requests (see the module docstring)."""

    medium: str | None = "GPU"
    merge_within: float = 1.0
    chunk_tokens: int | None = None
    requests: list[_Request] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    _parent: dict[int, int | None] = field(default_factory=dict)
    _tips: dict[int, int] = field(default_factory=dict)  # last key -> request index

    def batch(self, value: Any) -> None:
        """One decoded ``KVEventBatch``."""
        if not isinstance(value, list | tuple) or len(value) < 2 or not isinstance(value[1], list):
            self.skipped["objects that are not event batches"] += 1
            return
        ts = value[0]
        if not isinstance(ts, int | float) or isinstance(ts, bool) or not ts >= 0:
            self.skipped["batches without a valid ts"] += 1
            return
        for event in value[1]:
            self.event(float(ts), event)

    def event(self, ts: float, event: Any) -> None:
        fields = stored_fields(event)
        if fields is None:
            return
        if isinstance(fields, str):
            self.skipped[fields] += 1
            return
        hashes, parent, block_size, medium = fields
        if self.medium is not None and medium is not None and str(medium) != self.medium:
            return
        if self.chunk_tokens is None:
            self.chunk_tokens = block_size
        if block_size != self.chunk_tokens:
            self.skipped[f"events with a block_size other than {self.chunk_tokens}"] += 1
            return
        self._store(ts, [key_of(h) for h in hashes], None if parent is None else key_of(parent))

    def _store(self, ts: float, keys: list[int], parent: int | None) -> None:
        for key, up in zip(keys, [parent, *keys[:-1]], strict=True):
            self._parent.setdefault(key, up)
        index = self._tips.pop(parent, None) if parent is not None else None
        if index is not None and ts - self.requests[index].t <= self.merge_within:
            self.requests[index].keys += keys
        else:
            index = len(self.requests)
            self.requests.append(_Request(ts, self._chain(parent) + keys))
        self._tips[keys[-1]] = index

    def _chain(self, parent: int | None) -> list[int]:
        chain: list[int] = []
        while parent is not None and len(chain) < MAX_CHAIN:
            chain.append(parent)
            parent = self._parent.get(parent)
        return chain[::-1]


def stored_fields(event: Any) -> tuple[list[Any], Any, int, Any] | str | None:
    """``(block_hashes, parent, block_size, medium)`` of a BlockStored event; ``None`` for
    another event; a reason string for a malformed one."""
    if isinstance(event, dict):
        if event.get("type") != "BlockStored":
            return None
        values = [event.get(k) for k in ("block_hashes", "parent_block_hash", "block_size")]
        values.append(event.get("medium"))
    elif isinstance(event, list | tuple) and event:
        if event[0] != "BlockStored":
            return None
        if len(event) < 5:
            return "BlockStored events too short"
        values = [event[1], event[2], event[4], event[6] if len(event) > 6 else None]
    else:
        return "events that are neither maps nor tagged arrays"
    hashes, parent, block_size, medium = values
    if not isinstance(hashes, list) or not hashes or not all(_is_hash(h) for h in hashes):
        return "BlockStored events without valid block_hashes"
    if parent is not None and not _is_hash(parent):
        return "BlockStored events with an invalid parent_block_hash"
    if type(block_size) is not int or not 0 < block_size <= 1 << 20:
        return "BlockStored events without a valid block_size"
    return hashes, parent, block_size, medium


def _is_hash(value: Any) -> bool:
    return (isinstance(value, bytes) and len(value) > 0) or (type(value) is int and value >= 0)


def convert(capture: IO[bytes], out: IO[str], medium: str | None, merge_within: float) -> Converter:
    """Read a capture, write the trace; the converter (its requests and skip counts)."""
    try:
        import msgpack
    except ImportError:
        raise PlanInputError(
            "from-events needs msgpack: pip install -e '.[events]' in kvtier's clone"
        ) from None
    converter = Converter(medium, merge_within)
    unpacker = msgpack.Unpacker(capture, raw=False, strict_map_key=False, max_buffer_size=64 << 20)
    try:
        for value in unpacker:
            converter.batch(value)
    except (ValueError, msgpack.UnpackException, msgpack.ExtraData) as exc:
        converter.skipped[f"undecodable bytes at the end ({type(exc).__name__})"] += 1
    if not converter.requests:
        raise PlanInputError(f"no BlockStored events of medium {medium} in the capture")
    writer = TraceWriter(out, converter.chunk_tokens or 16, source="kvtier trace from-events")
    for request in converter.requests:
        writer.write(request.t, len(request.keys) * writer.chunk_tokens, request.keys)
    return converter
