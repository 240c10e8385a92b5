"""PeerHolds: the host-slot holds a peer server takes for its clients, per client and bounded;
``Replies``: the fetch replies that carry the held bytes, until sent or past their deadline.

A served chunk's slot is held (``HostTier.hold``) until its bytes are sent. Each connection
(named by its routing id) holds as its own owner, ``("peer", routing id)``, so its holds are
counted, bounded and released apart from every other owner's:

* **budget**: one client holds at most ``per_client`` slots at once and all clients together at
  most ``total``. A client is a CURVE key where the server uses CURVE (every connection made
  with one key shares its budget, so opening more connections gains nothing), else one
  connection. The chunks of a FETCH past the budget are sent unpinned, straight out of
  their slots (counted ``fetch_unpinned``): if the engine reuses such a slot before its bytes
  are sent, the client's verification turns that chunk into a miss. Budgets: a quarter of the
  host slots per client, half for all clients (at least one). The engine keeps the rest: no
  client, reading its replies or not, can take every slot from ``prepare_store``.
* **deadline**: a hold expires at an absolute deadline, ``hold_timeout_s`` after the client first
  took it. A FETCH of a key the client still holds gets that same deadline: renewals never
  extend it.
* **stall**: a client one of whose holds expired before its reply was sent (it does not read
  its replies) is served nothing until that reply is gone (sent, or dropped with its
  connection); its FETCHes are answered "not here" meanwhile (``fetch_refused_stalled``).

Thread safety: none; ``PeerHolds`` belongs to the manager's thread (``PeerServer.step``),
``Replies`` to the server's thread, which hands what it finds to ``step`` through the inbox.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from kvtier.keys import ChunkKey
from kvtier.tiers.peer.host_view import PeerHost
from kvtier.tiers.peer.transport import SendReceipt

log = logging.getLogger(__name__)

CLIENT_SHARE, PEERS_SHARE = 4, 2  # a client may hold 1/4 of the slots, all clients 1/2


def owner_of(peer: bytes) -> Hashable:
    """The hold owner of client ``peer`` (its routing id)."""
    return ("peer", peer)


@dataclass
class _Client:
    budget: bytes  # the name its holds count against (``per_client``)
    held: int = 0
    deadlines: dict[ChunkKey, tuple[float, int]] = field(default_factory=dict)  # key: (at, holds)
    stalled: int = 0  # replies whose holds expired before they were sent


@dataclass
class Grant:
    """What ``PeerHolds.take`` held: ``keys[i]`` in ``slots[i]``, until ``deadline`` at most.

    ``refused``: the client is stalled and is to be served nothing.
    """

    keys: list[ChunkKey]
    slots: list[int]
    deadline: float
    refused: bool = False


class PeerHolds:
    """Per-client holds of one peer server; see the module docstring."""

    def __init__(self, num_slots: int, hold_timeout_s: float) -> None:
        self.per_client = max(1, num_slots // CLIENT_SHARE)
        self.total = max(1, num_slots // PEERS_SHARE)
        self._timeout = hold_timeout_s
        self.counters: Counter[str] = Counter()  # read by other threads as ``dict(counters)``
        self._clients: dict[bytes, _Client] = {}
        self._budgets: Counter[bytes] = Counter()  # slots held per budget name
        self.held = 0  # slots held by all clients together

    def take(
        self,
        host: PeerHost,
        peer: bytes,
        ready: Sequence[ChunkKey],
        now: float,
        budget: bytes = b"",
    ) -> Grant:
        """Hold as many of the ``ready`` keys (the first ones) as ``peer`` may hold now.

        ``budget`` names whom the holds count against (``peer`` itself if empty); a connection
        keeps the budget it first took holds with until it holds nothing.
        """
        client = self._client(peer, budget or b"connection:" + peer)
        if client.stalled:
            self.counters["fetch_refused_stalled"] += 1
            self._forget_if_idle(peer, client)
            return Grant([], [], now, refused=True)
        used = self._budgets[client.budget]
        room = max(0, min(self.per_client - used, self.total - self.held))
        keys = list(ready[:room])
        if len(keys) < len(ready):
            self.counters["fetch_unpinned"] += len(ready) - len(keys)
        deadline = now + self._timeout
        for key in keys:
            at, holds = client.deadlines.get(key, (now + self._timeout, 0))
            client.deadlines[key] = (at, holds + 1)
            deadline = min(deadline, at)
        self._count(client, len(keys))
        slots = host.hold(keys, owner_of(peer))
        self._forget_if_idle(peer, client)
        return Grant(keys, slots, deadline)

    def give_back(self, host: PeerHost, peer: bytes, keys: Sequence[ChunkKey]) -> None:
        """Release holds that ``take`` gave ``peer`` (its reply was sent, or its deadline came)."""
        client = self._clients.get(peer)
        owner = owner_of(peer)
        if client is None or not host.can_release(keys, owner):
            self.counters["release_mismatch"] += 1  # a bug: never release another's hold
            log.error("peer server: release of %d chunk(s) a client does not hold", len(keys))
            return
        host.release(keys, owner)
        for key in keys:
            at, holds = client.deadlines[key]
            if holds > 1:
                client.deadlines[key] = (at, holds - 1)
            else:
                del client.deadlines[key]
        self._count(client, -len(keys))
        self._forget_if_idle(peer, client)

    def _client(self, peer: bytes, budget: bytes) -> _Client:
        client = self._clients.get(peer)
        if client is None:
            client = self._clients[peer] = _Client(budget)
        return client

    def _count(self, client: _Client, n: int) -> None:
        client.held += n
        self.held += n
        self._budgets[client.budget] += n
        if not self._budgets[client.budget]:
            del self._budgets[client.budget]

    def stall(self, peer: bytes, stalled: bool) -> None:
        """A reply of ``peer`` outlived its holds (``True``), or has now gone (``False``)."""
        client = self._client(peer, b"connection:" + peer)
        client.stalled += 1 if stalled else -1
        self._forget_if_idle(peer, client)

    def _forget_if_idle(self, peer: bytes, client: _Client) -> None:
        if not client.held and client.stalled <= 0:
            self._clients.pop(peer, None)


@dataclass
class Reply:
    """A fetch reply whose payload frames still point into slots held for ``peer``."""

    receipt: SendReceipt
    peer: bytes
    keys: list[ChunkKey]
    deadline: float


class Replies:
    """Fetch replies in flight; see the module docstring."""

    def __init__(self) -> None:
        self._sending: list[Reply] = []
        self._stalled: list[Reply] = []  # outlived their holds, still queued

    def __bool__(self) -> bool:
        return bool(self._sending or self._stalled)

    def add(self, receipt: SendReceipt, peer: bytes, keys: list[ChunkKey], deadline: float) -> None:
        self._sending.append(Reply(receipt, peer, keys, deadline))

    def check(self, now: float) -> tuple[list[Reply], list[Reply], list[bytes]]:
        """Replies sent, replies past their deadline (now stalled), peers of stalls now gone."""
        sent, expired, sending, stalled, recovered = [], [], [], [], []
        for reply in self._sending:  # ``done`` is read once: it may turn true meanwhile
            if reply.receipt.done:
                sent.append(reply)
            elif now >= reply.deadline:
                expired.append(reply)
            else:
                sending.append(reply)
        for reply in self._stalled:
            if reply.receipt.done:
                recovered.append(reply.peer)
            else:
                stalled.append(reply)
        self._sending, self._stalled = sending, stalled + expired
        return sent, expired, recovered
