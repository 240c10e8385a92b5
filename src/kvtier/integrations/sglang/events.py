"""KV events of kvtier's L3 under SGLang, in vLLM's wire format with SGLang's page hashes.

SGLang publishes GPU and CPU KV events only; kvtier adds L3's, so a router (llm-d's indexer,
Dynamo) sees where each page lives. One ``BlockStored`` per batch of pages a store wrote and
one ``BlockRemoved`` per batch of pages a tier evicted, each with ``medium: "DISK"`` and the
pages' hashes as SGLang computes them for its own events (``identity.page_hash``): the same
tagged maps vLLM and SGLang put in a ``KVEventBatch`` (``[ts, [event, ...]]``), published by
kvtier's ``EventPublisher`` on ``kv_events.endpoint``. ``ownership`` names the kvtier tier.

Thread safety: ``stored`` and ``removed`` run on SGLang's backup and load threads and take the
publisher's lock (the ZeroMQ socket is used by one thread at a time).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from kvtier.config.schema import KVEventsConfig
from kvtier.integrations.sglang.identity import page_hash
from kvtier.telemetry.kv_events import EventPublisher

MEDIUM = "DISK"


def stored_event(page_keys: Sequence[str], page_size: int, tier: str) -> dict[str, Any]:
    """The ``BlockStored`` map of ``page_keys`` written to ``tier``."""
    return {
        "type": "BlockStored",
        "block_hashes": [page_hash(k) for k in page_keys],
        "parent_block_hash": None,
        "token_ids": [],
        "block_size": page_size,
        "lora_id": None,
        "medium": MEDIUM,
        "ownership": tier,
    }


def removed_event(page_keys: Sequence[str], tier: str) -> dict[str, Any]:
    """The ``BlockRemoved`` map of ``page_keys`` gone from ``tier``."""
    hashes = [page_hash(k) for k in page_keys]
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": MEDIUM, "ownership": tier}


class PageEvents:
    """Publishes L3 page events (``kv_events`` configured); see the module docstring."""

    def __init__(self, config: KVEventsConfig, page_size: int) -> None:
        self._publisher = EventPublisher(config.endpoint, config.topic or "", config.hwm)
        self._page_size = page_size
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return self._publisher.endpoint

    def stored(self, page_keys: Sequence[str], tier: str) -> None:
        if page_keys:
            self._send(stored_event(page_keys, self._page_size, tier))

    def removed(self, page_keys: Sequence[str], tier: str) -> None:
        if page_keys:
            self._send(removed_event(page_keys, tier))

    def _send(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._publisher.publish_wire([event])

    def close(self) -> None:
        with self._lock:
            self._publisher.close()
