"""HiCacheBackend: kvtier's tiers as SGLang's HiCache L3, without importing SGLang.

``KvtierHiCacheStorage`` (``storage``) is this class mixed into SGLang's ``HiCacheStorage``;
everything it does is here, so it is tested with a host pool of the same shape in kvtier's own
environment. SGLang's calls, in order (0.5.23):

1. ``cls(storage_config, kwargs)`` on the scheduler thread: the ``kvtier`` key of
   ``storage_config.extra_config`` is parsed (``options``); a bad key raises ``ConfigError``
   naming it, which fails the attach.
2. ``register_mem_pool_host(pool)`` (and ``register_mem_host_pool_v2`` per sidecar pool of a
   hybrid model), then ``on_host_pools_registered()``: the page shape is read from the pool,
   the cache identity derived (``identity``), and one ``kvtier.core.runtime.Runtime`` built with
   the tiers (the same core kvtier's manager and the vLLM engine compose: jobs, switches, SLO
   guard, admission, metrics, ``/metrics`` and the admin endpoint). Raises to fail the attach.
3. From then on, on three SGLang threads at once: ``batch_exists`` (prefetch thread),
   ``batch_get_v1`` (load thread), ``batch_set_v1`` (backup thread), and the generic copying
   calls when ``interface_v1`` is off. None of them raises: a failure is a miss (``0``,
   ``False``), logged (throttled) and counted by the runtime.
4. ``clear()`` (SGLang's admin route) deletes this identity's chunks only; ``close()`` on detach.

With sidecar pools (Mamba, SWA, DSA indexer...) no page is ever a hit: kvtier stores the KV
pool only, and a KV page without its sidecar state would be a partial hit.

Thread safety: the three I/O threads share the ``PageStore`` (runtime lock) and the stats
(their own lock); building and closing run on the scheduler thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kvtier.core.runtime import Runtime
from kvtier.integrations.common.keymap import REVERSE_CAPACITY, KeyMap
from kvtier.integrations.common.tier_fit import fit_to_rows
from kvtier.integrations.sglang.clear import clear_namespace
from kvtier.integrations.sglang.events import PageEvents
from kvtier.integrations.sglang.identity import PoolShape, identity_for, pool_shape
from kvtier.integrations.sglang.options import BackendOptions, backend_options
from kvtier.integrations.sglang.pages import PageStore
from kvtier.integrations.sglang.spans import SpanRegion
from kvtier.integrations.sglang.stats import IoStats
from kvtier.telemetry.logs import ThrottledLog
from kvtier.tiers.registry import build_tier

log = logging.getLogger(__name__)
warn = ThrottledLog(log)
T = TypeVar("T")
KV_POOL = "kv"


class HiCacheBackend:
    """SGLang's storage-backend calls over kvtier's runtime (see the module docstring)."""

    def __init__(
        self,
        storage_config: Any,
        kwargs: Any = None,
        *,
        model_path: str | None = None,
        revision: str = "",
    ) -> None:
        self.storage_config = storage_config
        self.options: BackendOptions = backend_options(storage_config.extra_config)
        self._model_path, self._revision = model_path, revision
        self.mem_pool_host: Any = None
        self.sidecar_pools: list[str] = []
        self.runtime: Runtime | None = None
        self._pages: PageStore | None = None
        self._events: PageEvents | None = None
        self.shape: PoolShape | None = None
        self.stats = IoStats()
        self._build_lock = threading.Lock()

    # -- attach ----------------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """A pool of a hybrid model: a sidecar (not the KV pool) turns every hit off."""
        if str(host_pool_name) != KV_POOL and host_pool is not self.mem_pool_host:
            self.sidecar_pools.append(str(host_pool_name))

    def on_host_pools_registered(self) -> None:
        """Build the identity, tiers and runtime over the registered pool; raises (a
        ``ConfigError`` naming the key, or the tier's error) to fail the attach."""
        with self._build_lock:
            if self.runtime is None:
                self._build()

    def _build(self) -> None:
        if self.mem_pool_host is None:
            raise RuntimeError("kvtier: on_host_pools_registered before register_mem_pool_host")
        self.shape = shape = pool_shape(self.mem_pool_host)
        revision = "/".join(r for r in (self.options.revision, self._revision) if r)
        identity = identity_for(
            self.storage_config, self.mem_pool_host, shape, revision=revision,
            model_path=self._model_path, zero_copy=self.options.zero_copy,
        )  # fmt: skip
        self.identity, region = identity, SpanRegion(shape.span_bytes)
        runtime = Runtime(self.options.runtime, shape.span_bytes)
        try:
            for config in self.options.tiers:
                runtime.add_tier(build_tier(fit_to_rows(config, False), region, identity))
            runtime.bind()
            events = self.options.kv_events
            self._events = None if events is None else PageEvents(events, shape.page_size)
            runtime.serve({})
        except BaseException:
            runtime.close()
            raise
        keys = KeyMap(identity, REVERSE_CAPACITY if self._events is not None else 0)
        self._pages = PageStore(runtime, region, keys, shape, self._events)
        self.runtime = runtime
        log.info("kvtier L3 for SGLang: tiers %s, identity %s", runtime.tiers.names(),
                 identity.hexdigest[:16])  # fmt: skip

    def _store(self) -> PageStore:
        if self._pages is None:
            self.on_host_pools_registered()  # an SGLang that does not call it
        assert self._pages is not None
        return self._pages

    def _shape(self) -> PoolShape:
        self._store()
        assert self.shape is not None
        return self.shape

    # -- the zero-copy calls -----------------------------------------------------------------
    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """The leading pages of ``keys`` held (tier indexes only); 0 with sidecar pools."""
        if self.sidecar_pools or not keys:
            return 0
        return _safely("exists", 0, lambda: self._store().exists(keys))

    def batch_get_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        """Read pages into the host pool at ``host_indices``; a prefix of successes."""
        if self.sidecar_pools:
            return [False] * len(keys)
        return self._zero_copy(
            "load", keys, lambda p, s: self._store().load(keys, p, s), host_indices
        )

    def batch_set_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        """Write the host pool's pages at ``host_indices``; per page, whether it is held."""
        return self._zero_copy(
            "store", keys, lambda p, s: self._store().store(keys, p, s), host_indices
        )

    def _zero_copy(
        self,
        op: str,
        keys: Sequence[str],
        move: Callable[[Sequence[int], Sequence[int]], list[bool]],
        host_indices: Any,
    ) -> list[bool]:
        """``move`` over the host pool's spans at ``host_indices`` (never raises)."""

        def run() -> list[bool]:
            pointers, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
            return self._move(op, keys, pointers, sizes, move)

        return _safely(op, [False] * len(keys), run)

    def _move(
        self,
        op: str,
        keys: Sequence[str],
        pointers: Sequence[int],
        sizes: Sequence[int],
        move: Callable[[Sequence[int], Sequence[int]], list[bool]],
    ) -> list[bool]:
        if not keys:
            return []
        start = time.perf_counter()
        done = move(pointers, sizes)
        nbytes = sum(done) * self._shape().page_bytes
        self.stats.record(op, sum(done), nbytes, time.perf_counter() - start)
        return done

    # -- the generic (copying) calls: flat page tensors ------------------------------------------
    def _spans_of(self, tensors: Sequence[Any]) -> tuple[list[int], list[int]]:
        """Pointers and sizes of each page tensor's spans (``ValueError`` unless each tensor is
        one contiguous page)."""
        shape = self._shape()
        pointers: list[int] = []
        for tensor in tensors:
            nbytes = int(tensor.numel()) * int(tensor.element_size())
            if not tensor.is_contiguous() or nbytes != shape.page_bytes:
                raise ValueError(f"a page tensor of {nbytes} bytes, not {shape.page_bytes}")
            base = int(tensor.data_ptr())
            pointers += [base + i * shape.span_bytes for i in range(shape.spans)]
        return pointers, [shape.span_bytes] * len(pointers)

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[Any]:
        """Read pages into ``target_locations`` (flat page tensors); each the tensor or None."""
        if self.sidecar_pools or not target_locations:
            return [None] * len(keys)
        tensors = list(target_locations)

        def run() -> list[bool]:
            pointers, sizes = self._spans_of(tensors)
            return self._move(
                "load", keys, pointers, sizes, lambda p, s: self._store().load(keys, p, s)
            )

        done = _safely("load", [False] * len(keys), run)
        return [t if ok else None for t, ok in zip(tensors, done, strict=True)]

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Write flat page tensors ``values``; whether every page is held afterwards."""
        if values is None:
            return False
        tensors = list(values)

        def run() -> list[bool]:
            pointers, sizes = self._spans_of(tensors)
            return self._move(
                "store", keys, pointers, sizes, lambda p, s: self._store().store(keys, p, s)
            )

        return all(_safely("store", [False] * len(keys), run))

    def set(
        self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None
    ) -> bool:
        return self.batch_set([key], [value] if value is not None else None)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- the operator's calls ----------------------------------------------------------------
    def clear(self) -> bool:
        """Delete this identity's chunks from every fs and obj tier (other identities' and
        foreign files stay); whether that succeeded everywhere."""
        if self.runtime is None:
            return True
        return _safely("clear", False, lambda: clear_namespace(self.options.tiers, self.identity))

    def take_stats(self) -> dict[str, list[float]]:
        """Pages and bandwidth (GB/s) of each load and store since the last call."""
        return self.stats.take()

    def close(self) -> None:
        """Stop the endpoint and every tier (their threads joined), then the publisher."""
        with self._build_lock:
            runtime, self.runtime, self._pages = self.runtime, None, None
        if runtime is not None:
            runtime.close()
        if self._events is not None:
            self._events.close()
            self._events = None


def _safely(op: str, default: T, call: Callable[[], T]) -> T:
    """``call()``, or ``default`` when it raises (logged, throttled): SGLang must never see a
    storage exception (it would count it as 0 hits at best)."""
    try:
        return call()
    except Exception as exc:
        warn.warning(f"sglang-{op}", "kvtier L3 %s failed (a miss): %r", op, exc)
        return default
