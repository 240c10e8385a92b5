"""KV events: which chunk moved from which tier to which, for routers and for the engine.

The manager records one event whenever a chunk appears in, moves between, or leaves a tier. Tier
names are ``accelerator``, ``host`` and the names of the secondary tiers; a destination of
``None`` means the chunk is gone from the source. Sequence numbers increase by one per event.

On the wire (``kv_events`` configured) events are published the way vLLM 0.32 publishes its own
(``vllm.distributed.kv_events``), so its decoder and its consumers (llm-d's indexer, Dynamo's
relay) read them unchanged: a ZeroMQ PUB multipart message ``[topic, batch sequence (8 bytes,
big-endian), payload]`` whose payload is a msgpack ``KVEventBatch``, an array ``[ts, [event,
...]]``. Each event is a map tagged by ``"type"`` (vLLM's ``KVCacheEvent`` structs are tagged,
not array-like)::

    {"type": "BlockStored", "block_hashes": [key], "parent_block_hash": None, "token_ids": [],
     "block_size": tokens_per_chunk, "lora_id": None, "lora_name": None, "medium": medium,
     "locality": "LOCAL", "ownership": tier, "seq": ..., "kind": ..., "source": ...,
     "destination": ...}
    {"type": "BlockRemoved", "block_hashes": [key], "medium": medium, "locality": "LOCAL",
     "ownership": tier, "seq": ..., "kind": ..., "source": ..., "destination": None}

``key`` is the 32-byte chunk key. ``medium`` is where the chunk now is (stored) or was (removed),
in vLLM's words: ``GPU`` for the accelerator, ``CPU`` for host memory, ``STORAGE`` for a
secondary tier, whose name is then in ``ownership``. kvtier's richer record (``seq``, ``kind``,
``source``, ``destination``) rides along as extra keys, which vLLM's decoder ignores.
"""

from __future__ import annotations

import enum
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any, NamedTuple

from kvtier.keys import ChunkKey

if TYPE_CHECKING:
    from kvtier.tiers.peer.connection_bounds import ConnectionBounds


class EventKind(enum.Enum):
    STORED = "stored"  # accelerator -> host
    WRITTEN = "written"  # host -> secondary tier
    PROMOTED = "promoted"  # secondary tier -> host
    EVICTED = "evicted"  # host -> gone
    REMOVED = "removed"  # secondary tier -> gone
    LOADED = "loaded"  # host -> accelerator (the engine copied it back)


class KVEvent(NamedTuple):
    """One chunk movement (a tuple: cheap to make on the manager's hot path)."""

    seq: int
    kind: EventKind
    key: ChunkKey
    source: str
    destination: str | None
    locality: str = "local"


class _Batch(NamedTuple):
    """Events of one ``add``, numbered from ``seq``: made into ``KVEvent``s only when taken."""

    seq: int
    kind: EventKind
    keys: tuple[ChunkKey, ...]
    source: str
    destination: str | None
    locality: str

    def events(self) -> Iterator[KVEvent]:
        seqs = range(self.seq, self.seq + len(self.keys))
        fields = zip(
            seqs,
            repeat(self.kind),
            self.keys,
            repeat(self.source),
            repeat(self.destination),
            repeat(self.locality),
        )
        return map(KVEvent._make, fields)  # the C tuple constructor: no Python frames


class _Buffer:
    """Batches holding at most ``max_events`` events; the oldest go first (``put`` counts them)."""

    def __init__(self, max_events: int) -> None:
        self._batches: deque[_Batch] = deque()
        self._max, self._count = max_events, 0

    def __len__(self) -> int:
        return self._count

    def put(self, batch: _Batch) -> int:
        """Buffer ``batch``; returns how many of the oldest events were dropped for room."""
        self._batches.append(batch)
        self._count += len(batch.keys)
        excess = max(0, self._count - self._max)
        left = excess
        while left:
            oldest = self._batches.popleft()
            if len(oldest.keys) > left:  # keep its newest events
                self._batches.appendleft(
                    oldest._replace(seq=oldest.seq + left, keys=oldest.keys[left:])
                )
                break
            left -= len(oldest.keys)
        self._count -= excess
        return excess

    def take(self) -> list[KVEvent]:
        events = [event for batch in self._batches for event in batch.events()]
        self._batches.clear()
        self._count = 0
        return events


class EventLog:
    """Numbers events and buffers up to ``max_events`` of them until ``take``.

    When nobody takes events, the oldest are dropped (and counted in ``dropped``) so an unread
    log never grows without bound. ``on_add(kind, n)`` hears of every ``n`` events recorded.
    ``add`` keeps one record per call; the per-chunk ``KVEvent``s are made by ``take``.
    """

    def __init__(
        self,
        max_events: int = 100_000,
        outbox: bool = False,
        on_add: Callable[[EventKind, int], None] | None = None,
    ) -> None:
        self._on_add = on_add
        self._seq = 0
        self._events = _Buffer(max_events)
        self._outbox = _Buffer(max_events) if outbox else None
        self.dropped = 0

    def add(
        self,
        kind: EventKind,
        keys: Sequence[ChunkKey],
        source: str,
        destination: str | None,
        locality: str = "local",
    ) -> None:
        """Record one event per key; ``locality`` is ``remote`` when a peer instance is involved."""
        if not keys:
            return
        if self._on_add is not None:
            self._on_add(kind, len(keys))
        batch = _Batch(self._seq, kind, tuple(keys), source, destination, locality)
        self._seq += len(keys)
        self.dropped += self._events.put(batch)
        if self._outbox is not None:
            self._outbox.put(batch)

    def take(self) -> list[KVEvent]:
        return self._events.take()

    def take_outbox(self) -> list[KVEvent]:
        """Events not yet published (independent of ``take``)."""
        if not self._outbox:
            return []
        return self._outbox.take()


def medium(tier: str) -> str:
    """vLLM's medium of a kvtier tier name: ``GPU``, ``CPU`` or ``STORAGE``."""
    return {"accelerator": "GPU", "host": "CPU"}.get(tier, "STORAGE")


def _owner(tier: str) -> str | None:
    return None if tier in ("accelerator", "host") else tier


def to_wire(event: KVEvent, tokens_per_chunk: int) -> dict[str, Any]:
    """One event as the tagged map vLLM's ``BlockStored`` / ``BlockRemoved`` decode from."""
    where = event.source if event.destination is None else event.destination
    common = {
        "block_hashes": [bytes(event.key)],
        "medium": medium(where),
        "locality": event.locality.upper(),
        "ownership": _owner(where),
        "seq": event.seq,
        "kind": event.kind.value,
        "source": event.source,
        "destination": event.destination,
    }
    if event.destination is None:
        return {"type": "BlockRemoved", **common}
    stored: dict[str, Any] = {
        "parent_block_hash": None,
        "token_ids": [],
        "block_size": tokens_per_chunk,
    }
    return {"type": "BlockStored", **common, **stored, "lora_id": None, "lora_name": None}


def encode_batch(events: list[KVEvent], tokens_per_chunk: int, ts: float) -> bytes:
    """The msgpack ``KVEventBatch`` ``[ts, [event map, ...]]`` of ``events``."""
    import msgpack

    wire = [to_wire(e, tokens_per_chunk) for e in events]
    payload: bytes = msgpack.packb([ts, wire], use_bin_type=True)
    return payload


#: Subscribers connected at once; a connection beyond it is cut off at once (each one is a file
#: descriptor of the serving process, and libzmq has no bound of its own).
MAX_SUBSCRIBERS = 256
#: Bytes a subscriber may send (its handshake and subscriptions) before it is cut off.
MAX_SUBSCRIBER_BYTES = 1 << 20


class EventPublisher:
    """A ZeroMQ PUB socket sending event batches; never blocks (drops at the high-water mark).

    At most ``MAX_SUBSCRIBERS`` connections, each sending at most ``MAX_SUBSCRIBER_BYTES``, are
    kept (``connections_dropped`` counts the others by reason); a thread of its own watches them
    (``kvtier.tiers.peer.connection_bounds``, Linux only).

    Thread safety: call from one thread (the manager's).
    """

    def __init__(self, endpoint: str, topic: str = "", hwm: int = 100_000) -> None:
        import zmq

        self._zmq, self._guard = zmq, None
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUB)
        for option, value in ((zmq.SNDHWM, hwm), (zmq.LINGER, 0), (zmq.MAXMSGSIZE, 1 << 16)):
            self._socket.setsockopt(option, value)
        self.connections_dropped: Counter[str] = Counter()
        try:
            self._socket.bind(endpoint)
            self._guard = self._bound()
        except BaseException:
            self.close()
            raise
        self.endpoint: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._topic = topic.encode()
        self._batch_seq = 0
        self.dropped_batches = 0

    def publish(self, events: list[KVEvent], tokens_per_chunk: int) -> None:
        if not events:
            return
        self.send(encode_batch(events, tokens_per_chunk, time.time()))

    def publish_wire(self, wire: list[dict[str, Any]]) -> None:
        """Events already in their wire form (tagged maps, as ``to_wire`` makes them); an engine
        whose block hashes are not kvtier's chunk keys (SGLang's) builds its own maps."""
        if wire:
            import msgpack

            self.send(msgpack.packb([time.time(), wire], use_bin_type=True))

    def send(self, payload: bytes) -> None:
        """Send one msgpack ``KVEventBatch`` payload as the next batch."""
        frames = [self._topic, self._batch_seq.to_bytes(8, "big"), payload]
        try:
            self._socket.send_multipart(frames, flags=self._zmq.NOBLOCK)
        except self._zmq.Again:
            self.dropped_batches += 1
        self._batch_seq += 1

    def _bound(self) -> ConnectionBounds:
        """The guard that cuts off subscribers beyond the bounds, watching the socket's accepts."""
        from kvtier.tiers.peer.connection_bounds import ConnectionBounds

        monitor = self._socket.get_monitor_socket(self._zmq.EVENT_ACCEPTED)
        counts = self.connections_dropped
        return ConnectionBounds(
            monitor, MAX_SUBSCRIBER_BYTES, counts, MAX_SUBSCRIBERS, owner="kv events"
        )

    def close(self) -> None:
        if self._guard is not None:
            self._guard.close()
            self._socket.disable_monitor()
        self._context.destroy(linger=0)


def decode_batch(payload: bytes) -> tuple[float, list[dict[str, Any]]]:
    """Inverse of ``encode_batch``: ``(ts, [event map, ...])``; vLLM's own batches decode too.

    Raises ``ValueError`` for a payload that is not a batch of map events.
    """
    import msgpack

    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(batch, list | tuple) or len(batch) < 2:
        raise ValueError("expected an event batch [ts, [event, ...]]")
    ts, events = batch[0], batch[1]
    if not isinstance(events, list | tuple) or not all(isinstance(e, dict) for e in events):
        raise ValueError("expected events as tagged maps")
    return float(ts), list(events)


def describe_wire(event: Mapping[str, Any]) -> str:
    """One line for one of kvtier's wire events, e.g. ``#12 written host -> fs STORAGE
    key=ab12cd34ef56``. vLLM's own events (no ``seq`` or ``kind``) have their own line:
    ``cli_events.describe_vllm``."""
    tag = str(event.get("type", "?"))
    hashes = event.get("block_hashes") or []
    first = hashes[0] if hashes else None
    key = first.hex()[:16] if isinstance(first, bytes) else str(first)
    route = f"{event.get('source')} -> {event.get('destination') or 'gone'}"
    kind, where = event.get("kind", tag), str(event.get("medium"))
    return f"#{event.get('seq', '?')} {kind:<9} {route:<22} {where:<7} key={key}"


class EventSubscriber:
    """A ZeroMQ SUB socket connected to a publisher at once (so no event after it is missed)."""

    def __init__(self, endpoint: str, topic: str = "") -> None:
        import zmq

        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt_string(zmq.SUBSCRIBE, topic)
        self._socket.connect(endpoint)

    def batches(self, timeout_s: float | None = None) -> Iterator[tuple[int, float, list[Any]]]:
        """Yield ``(batch_seq, ts, [wire event, ...])``; stop after ``timeout_s`` of silence."""
        wait_ms = None if timeout_s is None else int(timeout_s * 1000)
        while self._socket.poll(wait_ms):
            _, seq, payload = self._socket.recv_multipart()
            ts, events = decode_batch(payload)
            yield int.from_bytes(seq, "big"), ts, events

    def close(self) -> None:
        self._socket.close()
        self._context.term()
