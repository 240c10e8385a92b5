"""Small model directories on disk for fingerprint tests: a config.json, a safetensors file
written byte by byte (header length, JSON header, data) and optionally a ``.bin`` file."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

CONFIG: dict[str, Any] = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2}


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]], seed: int = 0) -> bytes:
    """A valid safetensors file: ``tensors`` maps names to (dtype, shape); float data random."""
    rng = random.Random(seed)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset, data = 0, bytearray()
    for name, (dtype, shape) in sorted(tensors.items()):
        size = 4 if dtype == "F32" else 2
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        data += rng.randbytes(size)
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + bytes(data)


def write_model(
    path: Path,
    seed: int = 0,
    shape: tuple[int, int] = (64, 64),
    bin_bytes: int = 0,
    config: dict[str, Any] | None = None,
) -> Path:
    """A model directory at ``path``: config.json, model.safetensors, and ``extra.bin`` of
    ``bin_bytes`` random bytes when asked."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config or CONFIG, indent=2))
    tensors = {"embed.weight": ("F32", list(shape)), "layers.0.q.weight": ("F32", [64, 64])}
    (path / "model.safetensors").write_bytes(safetensors_bytes(tensors, seed))
    if bin_bytes:
        (path / "extra.bin").write_bytes(random.Random(seed + 1).randbytes(bin_bytes))
    return path
