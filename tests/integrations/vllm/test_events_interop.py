"""kvtier's published KV events decode with the installed vLLM's own ``KVEventBatch``."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integrations.vllm.engine import HERE

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]


def test_kvtier_event_batches_decode_with_vllms_structs(vllm_env):
    done = subprocess.run(
        [str(vllm_env.python), str(HERE / "events_interop.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    decoded = json.loads(done.stdout.strip().splitlines()[-1])
    assert decoded["ts"] == 1.25
    kinds = [(e["type"], e["medium"], e["ownership"]) for e in decoded["events"]]
    assert kinds == [
        ("BlockStored", "CPU", None),
        ("BlockStored", "STORAGE", "fs"),
        ("BlockStored", "CPU", None),
        ("BlockRemoved", "CPU", None),
        ("BlockRemoved", "STORAGE", "fs"),
    ]
    assert decoded["events"][0]["hashes"] == [("00" * 32)]
    assert decoded["events"][0]["block_size"] == 256
    assert decoded["events"][2]["locality"] == "REMOTE"
