"""KeyMap: an engine's page or block key to a kvtier chunk key, and recent ones back.

``chunk_key(engine_key) = sha256(identity digest || engine_key)``: the same engine key under
the same identity is the same chunk on every process and machine, and any change of identity
gives other keys. Used by the vLLM adapter (vLLM's 36-byte offload keys) and by the SGLang
backend (SGLang's page hash and the span's index). It remembers the last ``remember`` keys the
other way (none with ``remember=0``), so removals reported by a tier become engine keys again.

Thread safety: none of its own; each user calls it from one thread or under its own lock.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable

from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey

#: Engine keys remembered for turning tier removals back into engine keys.
REVERSE_CAPACITY = 1 << 16


class KeyMap:
    """Engine keys to kvtier chunk keys (and recent ones back); see the module docstring."""

    def __init__(self, identity: CacheIdentity, remember: int = REVERSE_CAPACITY) -> None:
        self._seed = identity.digest
        self._back: OrderedDict[ChunkKey, bytes] = OrderedDict()
        self._remember = remember

    def chunk_key(self, offload_key: bytes) -> ChunkKey:
        key = ChunkKey(hashlib.sha256(self._seed + bytes(offload_key)).digest())
        if not self._remember:
            return key
        self._back[key] = bytes(offload_key)
        self._back.move_to_end(key)
        if len(self._back) > self._remember:
            self._back.popitem(last=False)
        return key

    def chunk_keys(self, offload_keys: Iterable[bytes]) -> list[ChunkKey]:
        return [self.chunk_key(k) for k in offload_keys]

    def offload_key(self, key: ChunkKey) -> bytes | None:
        """The engine key ``key`` was made from, if it is still remembered."""
        return self._back.get(key)
