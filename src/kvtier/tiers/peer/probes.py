"""Probes: the peer tier's lookups in flight, and the re-asks of peers that answered COMING.

A key's lookup goes to one or more peers, and each answers (``protocol``) HELD: the key is
a hit, held by that peer; MISSING; or COMING: a storage tier of that peer holds the key and the
peer is bringing it into its host memory. A peer that answered COMING is asked again after
``REASK_DELAY_S``, until ``timeout_s`` after the key's first COMING; a COMING past that counts
as MISSING. The key is a miss once every asked peer has answered MISSING (a failed request
answers MISSING). Outcomes go to the tier's ``Answers``.

Thread safety: none; probes belong to the peer tier's I/O thread.
"""

from __future__ import annotations

from collections import deque

from kvtier.keys import ChunkKey
from kvtier.tiers.peer import protocol as proto
from kvtier.tiers.shared.answers import Answers

REASK_DELAY_S = 0.01


class Probes:
    """Keys whose lookup is out, the peers each still waits for, and re-asks due."""

    def __init__(self, answers: Answers, timeout_s: float) -> None:
        self._answers, self._timeout = answers, timeout_s
        self._waiting: dict[ChunkKey, int] = {}  # key -> peers yet to answer
        self._deadlines: dict[ChunkKey, float] = {}  # key -> end of its re-asks
        self._reasks: deque[tuple[float, str, ChunkKey]] = deque()  # (due, peer, key), in order

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def start(self, key: ChunkKey, num_peers: int) -> None:
        """``key`` was asked of ``num_peers`` peers (none: a miss at once)."""
        self._end(key)
        if num_peers:
            self._waiting[key] = num_peers
        else:
            self._answers.missing(key)

    def answer(self, key: ChunkKey, peer: str, state: int, now: float) -> None:
        """``peer`` answered ``state`` for ``key``; ignored when the key's probe is over."""
        if key not in self._waiting:
            return
        if state == proto.HELD:
            self._end(key)
            self._answers.found(key, peer)
        elif state == proto.COMING and now < self._deadlines.setdefault(key, now + self._timeout):
            self._reasks.append((now + REASK_DELAY_S, peer, key))
        elif self._waiting[key] > 1:
            self._waiting[key] -= 1
        else:
            self._end(key)
            self._answers.missing(key)

    def due(self, now: float) -> dict[str, list[ChunkKey]]:
        """The re-asks due by ``now``, per peer; each peer still owes its answer."""
        per_peer: dict[str, list[ChunkKey]] = {}
        while self._reasks and self._reasks[0][0] <= now:
            _, peer, key = self._reasks.popleft()
            if key in self._deadlines:  # else its probe ended (and may have started anew)
                per_peer.setdefault(peer, []).append(key)
        return per_peer

    def _end(self, key: ChunkKey) -> None:
        self._waiting.pop(key, None)
        self._deadlines.pop(key, None)
