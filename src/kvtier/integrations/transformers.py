"""Hugging Face transformers integration: serve prompt prefixes from kvtier instead of recomputing.

``TieredModel.generate(token_ids, max_new_tokens)`` for a causal LM (batch size 1, greedy):

1. The prompt's chunk keys are computed; at most ``N - 1`` tokens of an ``N``-token prompt are
   restored, because the model must see at least one token to produce the next one.
2. The leading chunks found in the engine's own accelerator-side cache (``DeviceChunkCache``)
   are taken from there; the following ones are asked of ``TieringManager.lookup`` (``RETRY`` is
   waited out with ``wait_progress``, up to ``retry_timeout_s``, while secondary tiers promote
   chunks into host) and copied from their host slots by the ``TransferEngine`` straight into
   slots of the device cache (``DeviceChunkCache.claim``; both through ``HostCopies``).
3. Those chunks become the model's ``DynamicCache`` (``hf_cache.CacheSession``); the model runs
   only on the rest of the prompt, then decodes greedily.
4. Every new full chunk of prompt and output goes into the device cache and is stored into host
   memory (from where the manager writes it through to every secondary tier).
5. TTFT and mean inter-token latency go to ``TieringManager.report_request`` (SLO guard).

``generate(..., priority=P, duration_s=D)``: every chunk of the request (stored or reused) gets
retention priority ``P`` (0-100) in host memory, for ``D`` seconds or for good.

Where each prompt token came from is counted in ``Generation.sources``: ``accelerator``,
``host``, the name of a secondary tier (for chunks it promoted), or ``recomputed``; and
``skipped`` for the tokens of a restored prefix that no layer needs (a model whose layers all
resume from a trailing window, ``KVLayout.window_chunks``: only that window is looked up and
loaded).

Layer types: full, sliding-window and latent (MLA) attention, and state-space layers (Mamba);
see ``hf_cache`` for how each maps to the layout.
Anything doubtful (a lookup that never settles, a failed copy) is a miss: the tokens are
recomputed, never served wrong.

With ``trace_path`` in the manager's configuration, every request is recorded there as a
``kvtier plan`` trace line (``kvtier.plan.recorder``: a background writer, bounded buffer).

Thread safety: none; one engine thread calls ``generate``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvtier.control.retention import expiry, request_priority
from kvtier.core.manager import TieringManager
from kvtier.device.staging import StackBuffer
from kvtier.device.transfer import TransferEngine
from kvtier.errors import ClosedError, ConfigError, InvalidArgumentError
from kvtier.identity import CacheIdentity
from kvtier.integrations.device_chunk_cache import DeviceChunkCache
from kvtier.integrations.hf_cache import CacheSession, StateMember, layout_for, probe
from kvtier.integrations.hf_identity import identity_for
from kvtier.integrations.hf_requests import (
    ModelLimits,
    key_salt,
    new_token_count,
    prompt_ids,
    retry_timeout,
    stop_set,
)
from kvtier.integrations.host_copies import HostCopies
from kvtier.keys import ChunkKey, chunk_keys
from kvtier.plan.recorder import open_recorder
from kvtier.telemetry.kv_events import KVEvent

__all__ = ["DeviceChunkCache", "Generation", "TieredModel", "identity_for", "layout_for"]

ACCELERATOR, HOST, RECOMPUTED, SKIPPED = "accelerator", "host", "recomputed", "skipped"
log = logging.getLogger(__name__)

_PREFETCHED = 4  # prompts whose keys prefetch keeps for generate


@dataclass
class Generation:
    """Result of one request.

    ``logits`` are the prefill logits of the prompt positions the model ran on (the last
    ``len(prompt) - cached_tokens``), ``[tokens, vocab]``; ``sources`` counts prompt tokens by
    origin; ``first_token_s`` is the time from the call to the first generated token,
    ``inter_token_s`` the mean time between the following ones (``None`` with one token).
    """

    tokens: list[int]
    logits: torch.Tensor
    cached_tokens: int
    sources: dict[str, int]
    first_token_s: float
    inter_token_s: float | None = None


@dataclass
class _Restored:
    """Chunks ``first ..`` of the prompt, restored; the prefix ends at chunk ``end``."""

    chunks: list[torch.Tensor] = field(default_factory=list)
    sources: Counter[str] = field(default_factory=Counter)
    first: int = 0

    @property
    def end(self) -> int:
        return self.first + len(self.chunks)


class TieredModel:
    """A causal LM whose prompt prefixes come from a device cache and kvtier when they can.

    ``manager`` (optional) must share ``identity``, whose layout must be the model's
    (``layout_for``; else ``ConfigError``); without it only the device cache serves.
    ``salt`` (text or bytes) seeds every key chain (``chunk_keys``): requests under another salt
    share nothing. ``retry_timeout_s``: finite, >= 0. Bad arguments: ``InvalidArgumentError``.
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
        self.retry_timeout_s, self.salt = retry_timeout(retry_timeout_s), key_salt(salt)
        self.model, self.identity, self.manager = model, identity, manager
        self.layout = layout = identity.layout
        if layout_for(model, layout.block_size, layout.blocks_per_chunk) != layout:
            raise ConfigError("layout: the identity's layout is not the model's (layout_for)")
        self.limits = ModelLimits.of(model)
        self.device_cache = DeviceChunkCache(0) if device_cache is None else device_cache
        self.transfer: TransferEngine | None = None
        self.copies: HostCopies | None = None  # loads and stores through the manager
        if manager is not None:
            self.transfer = TransferEngine(layout, manager.region, model.device)
            self.copies = HostCopies(
                manager, self.transfer, self.device_cache, self.retry_timeout_s,
                layout.tokens_per_chunk,
            )  # fmt: skip
        self.members = self._state_members()
        self._prefetched: deque[tuple[list[int], list[ChunkKey]]] = deque(maxlen=_PREFETCHED)
        self._stack_buffer = StackBuffer()
        self.trace = open_recorder(manager, self.layout.tokens_per_chunk)  # config.trace_path

    @torch.inference_mode()
    def generate(
        self,
        token_ids: Sequence[int],
        max_new_tokens: int = 1,
        stop_tokens: Collection[int] = (),
        *,
        priority: int | None = None,
        duration_s: float | None = None,
    ) -> Generation:
        """Greedy-decode up to ``max_new_tokens`` after ``token_ids``, reusing cached prefixes.

        Decoding ends early after a token of ``stop_tokens`` (e.g. the end-of-sequence token),
        or when the sequence fills the model's ``max_position_embeddings``.
        ``priority`` (0-100) and ``duration_s``: the retention of the request's chunks in host
        memory. Every argument is checked before any work (``InvalidArgumentError``,
        ``hf_requests``); ``ClosedError`` once the manager is closed.
        """
        prompt, stop = prompt_ids(token_ids, self.limits), stop_set(stop_tokens)
        steps = self.limits.decode_steps(len(prompt), new_token_count(max_new_tokens))
        request_priority(priority)
        expiry(duration_s)
        if self.manager is not None and self.manager.runtime.closed:
            raise ClosedError("generate: the manager is closed")
        retention = {"priority": priority, "duration_s": duration_s}
        started = time.perf_counter()
        if self.copies is not None:
            self.copies.finish()
        keys = self._keys(prompt)
        restored = self._restore(keys[: (len(prompt) - 1) // self.layout.tokens_per_chunk])
        end, cached = restored.end, restored.end * self.layout.tokens_per_chunk
        stacked = self._stack_buffer.stack(restored.chunks)  # valid until the next request
        restored.chunks = []  # the device cache may reuse their slots now
        session = CacheSession(self.model, self.layout, self.members, stacked, restored.first)
        logits = session.forward(prompt[cached:])
        tokens = [int(logits[-1].argmax())]
        first_token_s = time.perf_counter() - started
        if tokens[0] not in stop:
            tokens += self._decode(session, tokens[0], steps, stop)
        decoded_s = time.perf_counter() - started - first_token_s
        itl_s = decoded_s / (len(tokens) - 1) if len(tokens) > 1 else None
        if self.manager is not None:
            self.manager.report_request(ttft_s=first_token_s, itl_s=itl_s)
        restored.sources[RECOMPUTED] += len(prompt) - cached
        self._store(prompt + tokens[:-1], keys, session, end, retention)
        if self.trace is not None:  # queued for the recorder's thread; never blocks
            self.trace.record(len(prompt), keys, len(tokens))
        return Generation(tokens, logits, cached, dict(restored.sources), first_token_s, itl_s)

    def prefetch(self, token_ids: Sequence[int]) -> None:
        """Start bringing the cached prefix of a prompt that comes next into host memory, and
        return at once: a serving loop calls it for the request after the one it is about to
        run, so that the tiers' reads overlap this request's forward pass instead of delaying
        the next one's first token (``TieringManager.prefetch``). Chunks already in the device
        cache are skipped. Without a manager, or for a prompt ``generate`` would refuse, it does
        nothing: wrong ids are ``generate``'s business (it raises, this never does for ids).
        """
        if self.manager is None:
            return
        try:
            prompt = prompt_ids(token_ids, self.limits)
        except InvalidArgumentError:
            return
        if len(prompt) < 2:
            return
        all_keys = chunk_keys(prompt, self.identity, self.salt)
        self._prefetched.append((prompt, all_keys))
        keys = all_keys[: (len(prompt) - 1) // self.layout.tokens_per_chunk]
        window = self.layout.window_chunks
        if window is None:
            keys = keys[self.device_cache.match(keys) :]
        elif self.device_cache.match_window(keys, window) == len(keys):
            return  # generate resumes from the device cache alone
        if keys:
            self.manager.prefetch(keys)

    def _keys(self, prompt: list[int]) -> list[ChunkKey]:
        """The prompt's chunk keys: those ``prefetch`` computed, if it was one of the last
        ``_PREFETCHED`` prompts it was given (a serving loop prefetches the request after the
        one it runs: ``generate`` comes for another prompt first)."""
        for index, (known, keys) in enumerate(self._prefetched):
            if known == prompt:
                del self._prefetched[index]
                return keys
        return chunk_keys(prompt, self.identity, self.salt)

    def _decode(
        self, session: CacheSession, token: int, steps: int, stop: Collection[int]
    ) -> list[int]:
        tokens: list[int] = []
        while len(tokens) < steps and token not in stop:
            token = int(session.forward([token])[-1].argmax())
            tokens.append(token)
        return tokens

    def _state_members(self) -> dict[int, tuple[StateMember, ...]]:
        """The model's state tensors per state layer, checked against the layout."""
        section = self.layout.section("state")
        if section is None:
            return {}
        members = probe(self.model).states
        sizes = {sum(math.prod(m.shape) for m in members.get(i, ())) for i in section.layers}
        if sizes != {section.page_shape[0]}:
            raise ConfigError("layout: its state pages do not match the model's state tensors")
        return members

    # -- restore -----------------------------------------------------------------------------
    def _restore(self, keys: list[ChunkKey]) -> _Restored:
        """The longest prefix of ``keys`` available: device cache first, then kvtier."""
        window = self.layout.window_chunks
        if window is not None:
            return self._restore_window(keys, window)
        restored = _Restored()
        on_device = self.device_cache.match(keys)
        restored.chunks = self.device_cache.get(keys[:on_device])
        restored.sources[ACCELERATOR] = on_device * self.layout.tokens_per_chunk
        if self.manager is not None and on_device:
            self.manager.touch(keys[:on_device])
        loaded = [] if self.copies is None else self.copies.load(keys[on_device:], restored.sources)
        self.device_cache.put(keys[on_device : on_device + len(loaded)], loaded)
        restored.chunks += loaded
        return restored

    def _restore_window(self, keys: list[ChunkKey], window: int) -> _Restored:
        """The longest prefix of ``keys`` whose trailing ``window`` chunks are available.

        Only that window is loaded; its earlier chunks count as ``skipped``.
        """
        restored = _Restored()
        end = on_device = self.device_cache.match_window(keys, window)
        if on_device < len(keys) and self.copies is not None:
            end = max(on_device, self.copies.lookup(keys))
        restored.first = self.layout.resume_start(end)
        needed = keys[restored.first : end]
        if end == on_device:
            restored.chunks = self.device_cache.get(needed)
            restored.sources[ACCELERATOR] = len(needed) * self.layout.tokens_per_chunk
            if self.manager is not None:
                self.manager.touch(needed)
        elif self.copies is not None:
            restored.chunks = self.copies.copy_in(needed, restored.sources)
            self.device_cache.put(needed[: len(restored.chunks)], restored.chunks)
        if not restored.chunks:
            restored.first = 0
        restored.sources[SKIPPED] = restored.first * self.layout.tokens_per_chunk
        return restored

    # -- store -------------------------------------------------------------------------------
    def _store(
        self,
        tokens: list[int],
        prompt_keys: list[ChunkKey],
        session: CacheSession,
        first_chunk: int,
        retention: dict[str, Any],
    ) -> None:
        """Put chunks ``first_chunk ..`` of the tokens ``session`` has run everywhere
        (``prompt_keys``: the keys of the prompt these tokens start with).

        Afterwards every chunk of the sequence is marked used, its first chunk most recently,
        so that caches under pressure evict a conversation's tail before its prefix; in host
        memory, the whole sequence gets the request's ``retention`` (if it has one).
        """
        all_keys = chunk_keys(tokens, self.identity, self.salt, known=prompt_keys)
        keys = all_keys[first_chunk:]
        if keys:
            chunks = session.pack(first_chunk, len(keys))
            self.device_cache.put(keys, list(chunks.unbind(0)))
            if self.copies is not None:
                self.copies.store(all_keys, chunks, first_chunk, retention)
        self.device_cache.touch(all_keys)
        if self.manager is not None:
            self.manager.touch(all_keys[::-1], hit=False, **retention)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every copy to land (stores, late loads) and hand it to the manager."""
        if self.copies is not None:
            self.copies.flush(timeout)

    def take_events(self) -> list[KVEvent]:
        """The manager's events since the last call (``TieringManager.take_events``)."""
        return self.manager.take_events() if self.manager is not None else []
