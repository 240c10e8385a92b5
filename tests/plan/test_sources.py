"""Trace sources: TraceRecorder (bounded, never breaks serving), the transformers integration,
and captured KV events."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from kvtier.plan.recorder import TraceRecorder
from kvtier.plan.trace_from_events import convert
from kvtier.plan.trace_read import read_trace


def test_recorded_requests_read_back(tmp_path: Path) -> None:
    recorder = TraceRecorder(str(tmp_path / "t.jsonl"), 16, flush_interval_s=0.01)
    recorder.record(40, [b"\x00" * 7 + b"\x05" + b"\xff" * 24, 7], 3, t=1.0)
    recorder.record(20, [9], t=2.0)
    recorder.close()
    trace = read_trace(tmp_path / "t.jsonl")
    assert trace.keys.tolist() == [5, 7, 9] and trace.output_tokens.tolist() == [3, 0]
    assert recorder.written == 2 and not recorder.enabled


def test_an_unwritable_path_turns_recording_off_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="kvtier.plan"):
        recorder = TraceRecorder(str(tmp_path / "missing" / "t.jsonl"), 16)
        for _ in range(3):
            recorder.record(16, [1])
        recorder.close()
    assert not recorder.enabled
    assert len([r for r in caplog.records if "trace recording" in r.message]) == 1


def test_a_full_disk_turns_recording_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recorder = TraceRecorder(str(tmp_path / "t.jsonl"), 16, flush_interval_s=0.01)

    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

    recorder._file.close()
    recorder._file = Full()
    with caplog.at_level(logging.WARNING, logger="kvtier.plan"):
        recorder.record(16, [1])
        recorder.close()
        recorder.record(16, [2])  # after it is off: returns at once
    assert not recorder.enabled
    assert any("No space left" in r.message for r in caplog.records)


def test_the_buffer_is_bounded(tmp_path: Path) -> None:
    recorder = TraceRecorder(str(tmp_path / "t.jsonl"), 16, max_pending=4, flush_interval_s=60)
    with recorder._lock:  # the writer cannot take the buffer meanwhile
        pass
    recorder._wake.set = lambda: None  # type: ignore[method-assign]  # keep the writer asleep
    for _ in range(10):
        recorder.record(16, [1], t=1.0)
    assert recorder.dropped >= 6
    recorder._stop = True
    recorder.close()


def test_the_transformers_integration_records_its_requests(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from kvtier import TieringConfig, TieringManager
    from kvtier.integrations.transformers import TieredModel, identity_for, layout_for
    from kvtier.keys import chunk_keys
    from tests.integrations.conftest import build_model

    torch.set_num_threads(1)
    model = build_model("llama")
    identity = identity_for(model, layout_for(model, 4, 2))
    path = tmp_path / "trace.jsonl"
    config = TieringConfig.from_dict({"cpu_bytes_to_use": 1 << 24, "trace_path": str(path)})
    prompts = [list(range(1, 30)), list(range(1, 30)) + list(range(40, 49))]
    with TieringManager(config, identity) as manager:
        tiered = TieredModel(model, identity, manager)
        for prompt in prompts:
            tiered.generate(prompt, max_new_tokens=2)
        assert tiered.trace is not None
        tiered.trace.close()
    trace = read_trace(path)
    assert trace.chunk_tokens == 8 and trace.prompt_tokens.tolist() == [29, 38]
    expected = [int.from_bytes(k[:8], "big") for p in prompts for k in chunk_keys(p, identity)]
    assert trace.keys.tolist() == expected
    assert trace.output_tokens.tolist() == [2, 2]


def test_captured_kv_events_become_requests() -> None:
    msgpack = pytest.importorskip("msgpack")

    def stored(hashes: list[int], parent: int | None, medium: str = "GPU") -> list[object]:
        return ["BlockStored", hashes, parent, [], 16, None, medium]

    batches = [
        [1.0, [stored([1, 2, 3], None)]],
        [1.2, [stored([4], 3)]],  # decode continues the request stored 0.2 s earlier
        [5.0, [stored([5, 6], 2), stored([99], None, medium="CPU")]],  # a new request on 1-2
        [
            6.0,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [b"\x00" * 7 + b"\x07"],
                    "parent_block_hash": 6,
                    "block_size": 16,
                    "medium": "GPU",
                },
                ["BlockRemoved", [1], "GPU"],
            ],
        ],
        [7.0, [stored([], None), "junk"]],
        "not a batch",
    ]
    capture = io.BytesIO(b"".join(msgpack.packb(b) for b in batches) + b"\xc1\xc1")
    out = io.StringIO()
    converter = convert(capture, out, "GPU", merge_within=1.0)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [[int(c, 16) for c in line["chunks"]] for line in lines[1:]] == [
        [1, 2, 3, 4],
        [1, 2, 5, 6, 7],
    ]
    assert sum(converter.skipped.values()) == 4
    assert len(lines) == 3 and converter.output.requests == 2  # header + 2 requests
