"""Cache simulations that drive kvtier's own code: its policy classes, and ``HostTier`` itself.

Both follow one **op sequence** per request (keys in prompt order):

1. *lookup*: the hits are the longest prefix of usable chunks that is resident (``prefix``
   mode), or every resident usable chunk (per-chunk mode, for sampled streams, where a request
   keeps only some of its chunks);
2. *load*: the hits are touched, first chunk first;
3. *store*: every chunk not resident is added, last chunk first (a store is a first use),
   evicting through the policy with the request's resident chunks protected; with
   ``admission`` ("second use", ``min_reuse = 2``) a chunk is stored only if some earlier
   request used it (an unbounded record of every key seen: the best any admission filter of
   this kind can do); if not enough slots can be freed, nothing is stored;
4. *recency*: the chunks that were resident are touched, last chunk first, so a prefix outlives
   its tail.

For LRU this leaves exactly the order of ``stack``'s reference stream, so ``PolicySim("lru")``
and ``replay_host_tier(..., "lru")`` hit exactly what the stack distances predict whenever every
request has at most ``capacity`` chunks. (The transformers integration also touches the chunks
it has just stored; under ARC that counts a store as a second use and makes ARC behave as LRU.
The simulation counts a store as a first use, as ARC intends.)

Runs on the caller's thread.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterator
from itertools import pairwise
from typing import TypeVar

import numpy as np

from kvtier.core.host_slots import PROTECT, HostTier
from kvtier.keys import ChunkKey
from kvtier.plan.stack import Stream
from kvtier.policies import EvictionPolicy, make_policy

K = TypeVar("K", bound=Hashable)


def requests_of(stream: Stream) -> Iterator[tuple[list[int], list[bool]]]:
    """Each request's keys and usable flags, in prompt order (requests without keys, which
    change nothing, are left out)."""
    keys, usable, starts = stream.keys.tolist(), stream.usable.tolist(), stream.starts.tolist()
    for lo, hi in pairwise(starts):
        if hi > lo:
            yield keys[lo:hi][::-1], usable[lo:hi][::-1]


def count_hits(keys: list[K], usable: list[bool], resident: Container[K], prefix: bool) -> list[K]:
    """The hit keys of one lookup (step 1)."""
    if not prefix:
        return [k for k, u in zip(keys, usable, strict=True) if u and k in resident]
    hits = []
    for key, ok in zip(keys, usable, strict=True):
        if not ok or key not in resident:
            break
        hits.append(key)
    return hits


class PolicySim:
    """One cache of ``capacity`` chunks run by kvtier's ``policy`` class (``lru`` or ``arc``)."""

    def __init__(self, policy: str, capacity: int, admission: bool = False) -> None:
        self.capacity = capacity
        self.policy: EvictionPolicy[int] = make_policy(policy, capacity)
        self.seen: set[int] | None = set() if admission else None

    def request(self, keys: list[int], usable: list[bool], prefix: bool = True) -> int:
        """Serve one request (the op sequence above); how many of its chunks hit."""
        policy = self.policy
        hits = count_hits(keys, usable, policy, prefix)
        for key in hits:
            policy.touch(key)
        resident = [k for k in keys if k in policy]
        new = self._admitted([k for k in reversed(keys) if k not in policy])
        if new:
            shortfall = len(policy) + len(new) - self.capacity
            if shortfall <= 0 or policy.evict(shortfall, set(resident)) is not None:
                for key in new:
                    policy.add(key)
        for key in reversed(resident):
            policy.touch(key)
        return len(hits)

    def _admitted(self, new: list[int]) -> list[int]:
        if self.seen is None:
            return new
        admitted = [k for k in new if k in self.seen]
        self.seen.update(new)
        return admitted


def simulate(
    stream: Stream, policy: str, capacity: int, admission: bool = False, prefix: bool = True
) -> int:
    """Chunks hit over the whole stream by one ``PolicySim``."""
    return _run(list(requests_of(stream)), policy, capacity, admission, prefix)


def _run(
    requests: list[tuple[list[int], list[bool]]],
    policy: str,
    capacity: int,
    admission: bool,
    prefix: bool,
) -> int:
    sim = PolicySim(policy, max(1, capacity), admission)
    return sum(sim.request(keys, usable, prefix) for keys, usable in requests)


def replay_host_tier(stream: Stream, policy: str, capacity: int, admission: bool = False) -> int:
    """Chunks hit when the stream is replayed through a real ``kvtier.core.host_slots.HostTier``.

    The same op sequence, in HostTier's own calls: ``touch`` for loads, ``hold`` (as owner
    ``PROTECT``) + ``allocate`` + ``complete_write`` for stores, ``touch`` for recency.
    """
    tier = HostTier(capacity, policy)
    seen: set[ChunkKey] = set()
    total = 0
    for ints, usable in requests_of(stream):
        keys = [ChunkKey(k.to_bytes(8, "big")) for k in ints]
        hits = count_hits(keys, usable, tier, prefix=True)
        tier.touch(hits)
        total += len(hits)
        resident = [k for k in keys if k in tier]
        new = [k for k in reversed(keys) if k not in tier]
        if admission:
            admitted = [k for k in new if k in seen]
            seen.update(new)
            new = admitted
        if new:
            tier.hold(resident, PROTECT)
            allocated = tier.allocate(new)
            tier.release(resident, PROTECT)
            if allocated is not None:
                tier.complete_write(new, success=True)
        tier.touch(reversed(resident))
    return total


def curve(
    stream: Stream, policy: str, capacities: np.ndarray, admission: bool, prefix: bool
) -> np.ndarray:
    """Chunks hit at each capacity (one fresh simulation per capacity)."""
    requests = list(requests_of(stream))
    return np.array([_run(requests, policy, int(c), admission, prefix) for c in capacities])
