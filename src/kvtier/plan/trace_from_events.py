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

**Bounds** (``budget``, a ``MemoryBudget``: what ``--memory-budget`` allows). Requests are
written as soon as no later store extends them (they began over ``merge_within`` before the
batch being read), or oldest first while more than ``budget.pending_keys`` keys wait (where
times go backwards, a store that would have continued a request already written starts a new
one). At most
``budget.parent_links`` block -> parent links are kept: beyond, the older links are forgotten
and counted, but for those the chains of the newest half go through, which recent stores share
(a chain through a forgotten link is cut there, as for blocks stored before the capture). A
msgpack batch over ``budget.event_batch_bytes`` ends the reading, counted (``event_capture``).
A request whose line would be longer than ``budget.line_bytes`` is skipped and counted, never
written or held whole, so ``kvtier plan`` with the same or a larger budget reads every line.
The trace holds at most ``max_output_bytes``: beyond, ``PlanInputError`` (one error line).

Runs on the caller's thread.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter, deque
from dataclasses import dataclass
from itertools import islice
from typing import IO, Any

import numpy as np

from kvtier.plan.budget import LINE_BYTES_PER_KEY, GiB, MemoryBudget, text_of
from kvtier.plan.cost import PlanInputError
from kvtier.plan.event_capture import objects
from kvtier.plan.trace import header_line, key_of, request_line

DEFAULT_MAX_OUTPUT_BYTES = 1 * GiB


@dataclass
class _Request:
    t: float
    keys: array[int]  # of "Q"
    tip: int
    too_long: bool = False


class TraceOutput:
    """The trace being written to ``file``: the header before the first request, then request
    lines, none longer than ``line_bytes`` (newline excluded) and ``max_bytes`` in all."""

    def __init__(self, file: IO[str], line_bytes: int, max_bytes: int) -> None:
        self.file, self.line_bytes, self.max_bytes = file, line_bytes, max_bytes
        self.written = self.requests = 0
        self.chunk_tokens = 0

    def request(self, t: float, keys: array[int], chunk_tokens: int) -> bool:
        """Write one request; ``False`` (nothing written) when its line would be too long;
        ``PlanInputError`` when it would take the output over ``max_bytes``."""
        if len(keys) * LINE_BYTES_PER_KEY > self.line_bytes:
            return False
        line = request_line(t, len(keys) * chunk_tokens, np.frombuffer(keys, dtype=np.uint64))
        if len(line) - 1 > self.line_bytes:
            return False
        if not self.chunk_tokens:
            self.chunk_tokens = chunk_tokens
            self._put(header_line(chunk_tokens, source="kvtier trace from-events"))
        self._put(line)
        self.requests += 1
        return True

    def _put(self, text: str) -> None:
        if self.written + len(text) > self.max_bytes:
            raise PlanInputError(
                f"the trace would be larger than --max-output-bytes {text_of(self.max_bytes)} "
                f"({self.max_bytes:,} bytes) after {self.requests:,} requests; raise "
                "--max-output-bytes, or convert a part of the capture"
            )
        self.file.write(text)
        self.written += len(text)


class Converter:
    """Turns events into requests and writes them to ``output`` (see the module docstring)."""

    def __init__(
        self,
        output: TraceOutput,
        budget: MemoryBudget,
        medium: str | None = "GPU",
        merge_within: float = 1.0,
    ) -> None:
        self.output = output
        self.medium, self.merge_within = medium, merge_within
        self.chunk_tokens: int | None = None
        self.skipped: Counter[str] = Counter()
        self.forgotten = 0  # block -> parent links dropped to stay within the budget
        self._parent: dict[int, tuple[int | None, int]] = {}  # key -> (parent, chain length)
        self._tips: dict[int, _Request] = {}  # last key -> the pending request it ends
        self._pending: deque[_Request] = deque()
        self._pending_keys = 0
        self._max_keys, self._max_links = budget.line_keys, budget.parent_links
        self._max_pending = budget.pending_keys
        self._too_long = f"requests over {budget.line_bytes:,} bytes (the line limit of {budget})"

    def batch(self, value: Any) -> None:
        """One decoded ``KVEventBatch``; then the requests it closed are written."""
        if not isinstance(value, list | tuple) or len(value) < 2 or not isinstance(value[1], list):
            self.skipped["objects that are not event batches"] += 1
            return
        ts = value[0]
        if not isinstance(ts, int | float) or isinstance(ts, bool) or not _finite(ts):
            self.skipped["batches without a finite ts >= 0"] += 1
            return
        for event in value[1]:
            self.event(float(ts), event)
        self._flush(float(ts))

    def finish(self) -> None:
        """Write every request still pending."""
        self._flush(None)

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
        self._link(keys, parent)
        request = self._tips.pop(parent, None) if parent is not None else None
        if request is not None and ts - request.t <= self.merge_within:
            self._extend(request, keys)
        else:
            request = self._start(ts, keys, parent)
        request.tip = keys[-1]
        self._tips[request.tip] = request
        if len(self._parent) > self._max_links:
            self._forget()

    def _link(self, keys: list[int], parent: int | None) -> None:
        """Record each key's parent and chain length (a key keeps the first it was given)."""
        up, depth = parent, self._depth(parent)
        for key in keys:
            up, depth = key, self._parent.setdefault(key, (up, depth + 1))[1]

    def _depth(self, key: int | None) -> int:
        """Keys in the chain that ends at ``key``: 1 for a key whose parent is unknown."""
        if key is None:
            return 0
        entry = self._parent.get(key)
        return 1 if entry is None else entry[1]

    def _start(self, ts: float, keys: list[int], parent: int | None) -> _Request:
        request = _Request(ts, array("Q"), keys[-1])
        depth = self._depth(parent)
        if depth + len(keys) > self._max_keys:
            request.too_long = True
        else:
            request.keys = self._chain(parent, depth)
            request.keys.extend(keys)
        self._pending.append(request)
        self._pending_keys += len(request.keys)
        return request

    def _extend(self, request: _Request, keys: list[int]) -> None:
        if request.too_long:
            return
        if len(request.keys) + len(keys) > self._max_keys:
            request.too_long = True
            self._pending_keys -= len(request.keys)
            request.keys = array("Q")
            return
        request.keys.extend(keys)
        self._pending_keys += len(keys)

    def _chain(self, parent: int | None, depth: int) -> array[int]:
        """The keys from the root of ``parent``'s chain down to ``parent`` (at most ``depth``)."""
        chain: list[int] = []
        append, links = chain.append, self._parent.get
        for _ in range(depth):
            if parent is None:
                break
            append(parent)
            entry = links(parent)
            parent = None if entry is None else entry[0]
        chain.reverse()
        return array("Q", chain)

    def _forget(self) -> None:
        """Keep the newest half of the links, then the older links their chains go through (the
        prefixes recent stores share), up to three quarters of ``parent_links`` in all."""
        links, half = self._parent, self._max_links // 2
        kept = dict(islice(links.items(), len(links) - half, None))
        room = half + self._max_links // 4
        for key in islice(reversed(links), half):
            up = links[key][0]
            while up is not None and up not in kept and len(kept) < room:
                entry = links.get(up)
                if entry is None:
                    break
                kept[up], up = entry, entry[0]
        self.forgotten += len(links) - len(kept)
        self._parent = kept

    def _flush(self, now: float | None) -> None:
        """Write, oldest first, the requests no store at ``now`` can extend (all, without
        ``now``), and more while over ``budget.pending_keys`` keys wait."""
        pending = self._pending
        while pending and (
            now is None
            or now - pending[0].t > self.merge_within
            or self._pending_keys > self._max_pending
        ):
            self._write(pending.popleft())

    def _write(self, request: _Request) -> None:
        if self._tips.get(request.tip) is request:
            del self._tips[request.tip]
        self._pending_keys -= len(request.keys)
        tokens = self.chunk_tokens or 1
        if request.too_long or not self.output.request(request.t, request.keys, tokens):
            self.skipped[self._too_long] += 1


def _finite(ts: float) -> bool:
    return math.isfinite(ts) and ts >= 0


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


def convert(
    capture: IO[bytes],
    out: IO[str],
    medium: str | None,
    merge_within: float,
    budget: MemoryBudget | None = None,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
) -> Converter:
    """Read a capture, write the trace; the converter (its output, skip counts). Within
    ``budget`` (default ``MemoryBudget()``); ``PlanInputError`` when no request comes out, or
    the trace would exceed ``max_output_bytes``."""
    budget = budget or MemoryBudget()
    output = TraceOutput(out, budget.line_bytes, max_output_bytes)
    converter = Converter(output, budget, medium, merge_within)
    limit = budget.event_batch_bytes
    over = f"batches over {limit:,} bytes (the limit of {budget}): read up to the first"
    for value in objects(capture, limit, converter.skipped, over):
        converter.batch(value)
    converter.finish()
    if not output.requests:
        raise PlanInputError(_nothing(converter, medium))
    return converter


def _nothing(converter: Converter, medium: str | None) -> str:
    """Why no request came out of the capture."""
    skipped = ", ".join(f"{n:,} {reason}" for reason, n in converter.skipped.most_common(3))
    if converter.chunk_tokens is None:
        found = f"no BlockStored events of medium {medium} in the capture"
        return found + (f" ({skipped})" if skipped else "")
    return f"no request of the capture could be written ({skipped}); raise --memory-budget"
