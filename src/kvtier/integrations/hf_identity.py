"""The cache identity of a Hugging Face transformers model: bound to its weights and config,
not to its name or the path it was loaded from (``identity_for``).

Thread safety: a pure function of the model; any thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
import xxhash

from kvtier.identity import CacheIdentity
from kvtier.layout import KVLayout
from kvtier.model_fingerprint import display_name, is_local

log = logging.getLogger(__name__)


def identity_for(model: Any, layout: KVLayout, name: str | None = None) -> CacheIdentity:
    """A cache identity bound to the model's weights and config, not to its name or path.

    Every loaded weight is hashed (xxh3-128, in memory) into the identity's ``fingerprint``, and
    the config's sha256 into ``extra``. Two models that differ in any weight or config value get
    different identities, so a cache written by one is never read by the other; the same weights
    loaded from two paths get the same one. ``name`` (default: the basename of the config's
    ``name_or_path``, else the class name) is only displayed.
    """
    start = time.perf_counter()
    digest = xxhash.xxh3_128()
    hashed = 0
    for tensor_name, tensor in sorted(model.state_dict().items()):
        digest.update(tensor_name.encode())
        data = tensor.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy()
        digest.update(data)
        hashed += data.nbytes
    config = json.loads(model.config.to_json_string(use_diff=False))
    config.pop("_name_or_path", None)  # where it was loaded from: not part of the model
    config_text = json.dumps(config, sort_keys=True)
    log.info(
        "model fingerprint: hashed %.1f MiB of loaded weights in %.3f s",
        hashed / 2**20, time.perf_counter() - start,
    )  # fmt: skip
    return CacheIdentity(
        model=name or _display_name(model) or type(model).__name__,
        layout=layout,
        extra={"config_sha256": hashlib.sha256(config_text.encode()).hexdigest()},
        fingerprint=f"weights-xxh3-{digest.hexdigest()}",
    )


def _display_name(model: Any) -> str:
    """The config's ``name_or_path``: a hub id as is, a local path by its display name."""
    name = str(getattr(model.config, "name_or_path", "") or "")
    return display_name(Path(name)) if is_local(name) else name
