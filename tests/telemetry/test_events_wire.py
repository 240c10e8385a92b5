"""The KV event wire format: vLLM 0.32's tagged map events inside an array-like batch.

Interop with vLLM's own decoder (its structs, imported from an installed vLLM) is tested in
``tests/integrations/vllm/test_engine.py``; these tests pin the shape and kvtier's extra keys.
"""

from __future__ import annotations

import msgpack
import pytest

from kvtier.keys import ChunkKey
from kvtier.telemetry.kv_events import (
    EventKind,
    KVEvent,
    decode_batch,
    describe_wire,
    encode_batch,
    medium,
    to_wire,
)

KEY = ChunkKey(bytes(range(32)))


def event(kind: EventKind, source: str, destination: str | None, seq: int = 7) -> KVEvent:
    return KVEvent(seq, kind, KEY, source, destination, "local")


def test_a_stored_event_is_a_block_stored_map_with_kvtier_extras():
    wire = to_wire(event(EventKind.WRITTEN, "host", "fs"), tokens_per_chunk=256)
    assert wire["type"] == "BlockStored"
    assert wire["block_hashes"] == [bytes(KEY)] and wire["block_size"] == 256
    assert wire["parent_block_hash"] is None and wire["token_ids"] == []
    assert (wire["medium"], wire["ownership"], wire["locality"]) == ("STORAGE", "fs", "LOCAL")
    assert {k: wire[k] for k in ("seq", "kind", "source", "destination")} == {
        "seq": 7,
        "kind": "written",
        "source": "host",
        "destination": "fs",
    }


def test_a_removal_names_the_medium_the_chunk_left():
    wire = to_wire(event(EventKind.EVICTED, "host", None), tokens_per_chunk=256)
    assert wire["type"] == "BlockRemoved"
    assert (wire["medium"], wire["ownership"], wire["destination"]) == ("CPU", None, None)


@pytest.mark.parametrize(
    ("tier", "expected"),
    [("accelerator", "GPU"), ("host", "CPU"), ("fs", "STORAGE"), ("p2p", "STORAGE")],
)
def test_media_are_vllms(tier, expected):
    assert medium(tier) == expected


def test_the_batch_is_an_array_of_ts_and_map_events():
    events = [
        event(EventKind.STORED, "accelerator", "host", 0),
        event(EventKind.REMOVED, "fs", None, 1),
    ]
    raw = msgpack.unpackb(encode_batch(events, 16, 1.5), raw=False)
    assert isinstance(raw, list) and raw[0] == 1.5
    assert all(isinstance(e, dict) and "type" in e for e in raw[1])


def test_decode_batch_inverts_encode_batch():
    events = [event(EventKind.PROMOTED, "obj", "host", 3)]
    ts, wire = decode_batch(encode_batch(events, 16, 2.0))
    assert ts == 2.0 and wire == [to_wire(events[0], 16)]


def test_decode_batch_reads_vllms_own_batches():
    """vLLM's publisher: integer hashes, no kvtier extras, a data-parallel rank after the events."""
    vllm_event = {"type": "BlockRemoved", "block_hashes": [12345], "medium": "GPU"}
    ts, wire = decode_batch(msgpack.packb([3.0, [vllm_event], 0]))
    assert (ts, wire) == (3.0, [vllm_event])
    from kvtier.cli.events import describe

    assert describe(wire[0]).split()[:3] == ["removed", "GPU", "blocks=1"]  # not "gone"


@pytest.mark.parametrize("payload", [[1.0], [1.0, [["BlockStored", [b"k"]]]], {"ts": 1}])
def test_decode_batch_refuses_what_is_not_a_batch_of_maps(payload):
    with pytest.raises(ValueError):
        decode_batch(msgpack.packb(payload))


def test_describe_wire_says_what_moved_where():
    line = describe_wire(to_wire(event(EventKind.WRITTEN, "host", "fs", 12), 16))
    assert line.split() == [
        "#12",
        "written",
        "host",
        "->",
        "fs",
        "STORAGE",
        f"key={KEY.hex()[:16]}",
    ]
