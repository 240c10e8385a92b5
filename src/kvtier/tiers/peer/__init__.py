"""Peer-to-peer: other kvtier instances' host memory as a tier, and serving ours to them.

Client side: ``tier`` (``PeerTier``), ``link`` (one peer's connection and handshake), ``probes``
(batched lookups). Server side: ``server`` (``PeerServer``, a manager service), ``server_holds``
(per-client slot holds with budgets and deadlines), ``server_listen`` (the listener thread).
Both: ``protocol`` (messages and their validation), ``transport`` (ZeroMQ sockets, CURVE),
``listener`` and ``guard`` (bounding what a connection may send before it is buffered).

Nothing here is imported by ``import kvtier``: pyzmq is needed only when a peer tier or a peer
server is configured.
"""
