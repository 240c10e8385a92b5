"""Hugging Face transformers integration: serve prompt prefixes from kvtier instead of recomputing.

``TieredModel.generate(token_ids, max_new_tokens)`` for a causal LM (batch size 1, greedy):

1. The prompt's chunk keys are computed; at most ``N - 1`` tokens of an ``N``-token prompt are
   restored, because the model must see at least one token to produce the next one.
2. The leading chunks found in the engine's own accelerator-side cache (``DeviceChunkCache``)
   are taken from there; the following ones are asked of ``TieringManager.lookup`` (``RETRY`` is
   waited out, up to ``retry_timeout_s``, while secondary tiers promote chunks into host) and
   copied from their host slots by the ``TransferEngine``.
3. Those chunks become the model's ``DynamicCache``; the model runs only on the rest of the
   prompt, then decodes greedily.
4. Every new full chunk of prompt and output goes into the device cache and is stored into host
   memory (from where the manager writes it through to every secondary tier).

Where each prompt token came from is counted in ``Generation.sources``: ``accelerator``,
``host``, the name of a secondary tier (for chunks it promoted), or ``recomputed``.
Anything doubtful (a lookup that never settles, a failed copy) is a miss: the tokens are
recomputed, never served wrong.

Thread safety: none; one engine thread calls ``generate``.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter, OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import xxhash
from transformers import DynamicCache

from kvtier.errors import ConfigError, KVTierError
from kvtier.events import EventKind, KVEvent
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey, chunk_keys
from kvtier.layout import KVLayout
from kvtier.manager import TieringManager
from kvtier.tiers.base import RETRY
from kvtier.transfer import TORCH_DTYPES, TransferEngine, pack_chunks, unpack_chunks

ACCELERATOR, HOST, RECOMPUTED = "accelerator", "host", "recomputed"
_DTYPE_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}


def layout_for(model: Any, block_size: int = 16, blocks_per_chunk: int = 16) -> KVLayout:
    """The ``KVLayout`` of a full-attention causal LM's KV cache, in the model's dtype."""
    config = model.config.get_text_config(decoder=True)
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise ConfigError(f"layer_types: only full attention is supported, got {layer_types}")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return KVLayout(
        num_layers=config.num_hidden_layers,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        dtype=_DTYPE_NAMES[model.dtype],
        block_size=block_size,
        blocks_per_chunk=blocks_per_chunk,
    )


def identity_for(model: Any, layout: KVLayout, name: str | None = None) -> CacheIdentity:
    """A cache identity bound to the model's weights and config, not only to its name.

    Two models that differ in any weight or config value get different identities, so a cache
    written by one is never read by the other.
    """
    digest = xxhash.xxh3_128()
    for tensor_name, tensor in sorted(model.state_dict().items()):
        digest.update(tensor_name.encode())
        digest.update(tensor.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy())
    config_text = model.config.to_json_string(use_diff=False)
    return CacheIdentity(
        model=name or getattr(model.config, "name_or_path", "") or type(model).__name__,
        layout=layout,
        revision=f"weights-xxh3-{digest.hexdigest()}",
        extra={"config_sha256": hashlib.sha256(config_text.encode()).hexdigest()},
    )


class DeviceChunkCache:
    """The engine's accelerator-side prefix cache: chunk key -> canonical chunk tensor, LRU.

    ``capacity`` counts chunks; ``None`` never evicts, ``0`` keeps nothing.
    """

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self._chunks: OrderedDict[ChunkKey, torch.Tensor] = OrderedDict()
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._chunks)

    def match(self, keys: Sequence[ChunkKey]) -> int:
        """How many leading ``keys`` are cached."""
        count = 0
        while count < len(keys) and keys[count] in self._chunks:
            count += 1
        return count

    def get(self, keys: Sequence[ChunkKey]) -> list[torch.Tensor]:
        """The chunks of ``keys`` (all cached), marked most recently used."""
        self.touch(keys)
        return [self._chunks[key] for key in keys]

    def touch(self, keys: Sequence[ChunkKey]) -> None:
        """Mark the cached ``keys`` used, the first most recently: a prefix outlives its tail."""
        for key in reversed(keys):
            if key in self._chunks:
                self._chunks.move_to_end(key)

    def put(self, keys: Sequence[ChunkKey], chunks: Sequence[torch.Tensor]) -> None:
        """Cache ``chunks`` under ``keys``, evicting the least recently used beyond capacity."""
        if self.capacity == 0:
            return
        for key, chunk in zip(reversed(keys), reversed(chunks), strict=True):
            self._chunks[key] = chunk
            self._chunks.move_to_end(key)
        while self.capacity is not None and len(self._chunks) > self.capacity:
            self._chunks.popitem(last=False)
            self.num_evicted += 1


@dataclass
class Generation:
    """Result of one request.

    ``logits`` are the prefill logits of the prompt positions the model ran on (the last
    ``len(prompt) - cached_tokens``), ``[tokens, vocab]``; ``sources`` counts prompt tokens by
    origin; ``first_token_s`` is the time from the call to the first generated token.
    """

    tokens: list[int]
    logits: torch.Tensor
    cached_tokens: int
    sources: dict[str, int]
    first_token_s: float


@dataclass
class _Restored:
    chunks: list[torch.Tensor] = field(default_factory=list)
    sources: Counter[str] = field(default_factory=Counter)


class TieredModel:
    """A causal LM whose prompt prefixes come from a device cache and kvtier when they can.

    ``manager`` (optional) must share ``identity``; without it only the device cache serves.
    ``salt`` seeds every key chain (``chunk_keys``): requests under another salt share nothing.
    """

    def __init__(
        self,
        model: Any,
        identity: CacheIdentity,
        manager: TieringManager | None = None,
        *,
        device_cache: DeviceChunkCache | None = None,
        retry_timeout_s: float = 5.0,
        salt: str | None = None,
    ) -> None:
        if manager is not None and manager.identity.digest != identity.digest:
            raise ConfigError("identity: the manager was built for another cache identity")
        self.model, self.identity, self.manager = model, identity, manager
        self.layout = identity.layout
        self.device_cache = DeviceChunkCache(0) if device_cache is None else device_cache
        self.retry_timeout_s, self.salt = retry_timeout_s, salt
        self.transfer = None if manager is None else TransferEngine(
            self.layout, manager.region, model.device
        )  # fmt: skip
        self._stores: dict[int, list[ChunkKey]] = {}
        self._events: list[KVEvent] = []

    @torch.inference_mode()
    def generate(
        self, token_ids: Sequence[int], max_new_tokens: int = 1, stop_tokens: Collection[int] = ()
    ) -> Generation:
        """Greedy-decode up to ``max_new_tokens`` after ``token_ids``, reusing cached prefixes.

        Decoding ends early after a token of ``stop_tokens`` (e.g. the end-of-sequence token).
        """
        if not token_ids or max_new_tokens < 1:
            raise ValueError("generate needs a non-empty prompt and max_new_tokens >= 1")
        started = time.perf_counter()
        self._finish_stores()
        prompt = [int(t) for t in token_ids]
        keys = chunk_keys(prompt, self.identity, self.salt)
        restored = self._restore(keys[: (len(prompt) - 1) // self.layout.tokens_per_chunk])
        cached = len(restored.chunks) * self.layout.tokens_per_chunk
        cache = self._cache_from(restored.chunks)
        ids = torch.tensor([prompt[cached:]], device=self.model.device)
        logits = self.model(input_ids=ids, cache=cache, use_cache=True).logits[0]
        tokens = [int(logits[-1].argmax())]
        first_token_s = time.perf_counter() - started
        if tokens[0] not in stop_tokens:
            tokens += self._decode(cache, tokens[0], max_new_tokens - 1, stop_tokens)
        restored.sources[RECOMPUTED] += len(prompt) - cached
        self._store(prompt + tokens[:-1], cache, len(restored.chunks))
        return Generation(tokens, logits, cached, dict(restored.sources), first_token_s)

    def _decode(self, cache: Any, token: int, steps: int, stop: Collection[int]) -> list[int]:
        tokens: list[int] = []
        while len(tokens) < steps and token not in stop:
            ids = torch.tensor([[token]], device=self.model.device)
            logits = self.model(input_ids=ids, cache=cache, use_cache=True).logits
            token = int(logits[0, -1].argmax())
            tokens.append(token)
        return tokens

    def _cache_from(self, chunks: list[torch.Tensor]) -> Any:
        if not chunks:
            return DynamicCache(config=self.model.config)
        layers = unpack_chunks(torch.stack(chunks), self.layout)
        return DynamicCache(layers, config=self.model.config)

    # -- restore -----------------------------------------------------------------------------
    def _restore(self, keys: list[ChunkKey]) -> _Restored:
        """The longest prefix of ``keys`` available: device cache first, then kvtier."""
        restored = _Restored()
        on_device = self.device_cache.match(keys)
        restored.chunks = self.device_cache.get(keys[:on_device])
        restored.sources[ACCELERATOR] = on_device * self.layout.tokens_per_chunk
        if self.manager is not None and on_device:
            self.manager.touch(keys[:on_device])
        loaded = self._load(keys[on_device:], restored.sources)
        self.device_cache.put(keys[on_device : on_device + len(loaded)], loaded)
        restored.chunks += loaded
        return restored

    def _load(self, keys: list[ChunkKey], sources: Counter[str]) -> list[torch.Tensor]:
        if self.manager is None or self.transfer is None or not keys:
            return []
        ready = self._lookup(keys)
        if not ready:
            return []
        loading = keys[:ready]
        slots = self.manager.prepare_load(loading)
        try:
            job_id = self.transfer.submit_load(slots)
            chunks = self.transfer.wait(job_id, self.retry_timeout_s).chunks
        except KVTierError:
            return []
        finally:
            self.manager.complete_load(loading)
        assert chunks is not None
        self._attribute(loading, sources)
        return list(chunks.unbind(0))

    def _lookup(self, keys: list[ChunkKey]) -> int:
        """Leading ``keys`` ready in host, waiting out ``RETRY``; 0 if it never settles."""
        assert self.manager is not None
        deadline = time.monotonic() + self.retry_timeout_s
        while (ready := self.manager.lookup(keys)) is RETRY:
            if time.monotonic() > deadline:
                return 0
            time.sleep(0.0002)
        assert isinstance(ready, int)
        return ready

    def _attribute(self, keys: list[ChunkKey], sources: Counter[str]) -> None:
        """Count ``keys`` by the tier that promoted them into host, ``host`` if none did."""
        assert self.manager is not None
        events = self.manager.take_events()
        self._events += events
        promoted = {e.key: e.source for e in events if e.kind is EventKind.PROMOTED}
        for key in keys:
            sources[promoted.get(key, HOST)] += self.layout.tokens_per_chunk

    # -- store -------------------------------------------------------------------------------
    def _store(self, tokens: list[int], cache: Any, first_chunk: int) -> None:
        """Put chunks ``first_chunk ..`` of the tokens whose KV ``cache`` holds everywhere.

        Afterwards every chunk of the sequence is marked used, its first chunk most recently,
        so that caches under pressure evict a conversation's tail before its prefix.
        """
        all_keys = chunk_keys(tokens, self.identity, self.salt)
        keys = all_keys[first_chunk:]
        if keys:
            kv = [(layer.keys, layer.values) for layer in cache.layers]
            chunks = pack_chunks(kv, self.layout, first_chunk, len(keys))
            self.device_cache.put(keys, list(chunks.unbind(0)))
            self._store_in_host(keys, chunks)
        self.device_cache.touch(all_keys)
        if self.manager is not None:
            self.manager.touch(all_keys[::-1])

    def _store_in_host(self, keys: list[ChunkKey], chunks: torch.Tensor) -> None:
        if self.manager is None or self.transfer is None:
            return
        plan = self.manager.prepare_store(keys)
        if plan is None or not plan.keys:
            return
        index = {key: i for i, key in enumerate(keys)}
        rows = torch.tensor([index[key] for key in plan.keys], device=chunks.device)
        job_id = self.transfer.submit_store(chunks.index_select(0, rows), plan.slots)
        self._stores[job_id] = plan.keys
        self._finish_stores()

    def _finish_stores(self) -> None:
        if self.manager is None or self.transfer is None:
            return
        for result in self.transfer.poll():
            self.manager.complete_store(self._stores.pop(result.job_id), success=True)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every store copy to land and hand it to the manager."""
        if self.manager is None or self.transfer is None:
            return
        for job_id in list(self._stores):
            self.transfer.wait(job_id, timeout)
            self.manager.complete_store(self._stores.pop(job_id), success=True)

    def take_events(self) -> list[KVEvent]:
        """The manager's events, which this adapter drains to attribute promoted chunks."""
        events = self._events + (self.manager.take_events() if self.manager else [])
        self._events = []
        return events
