"""Peer-to-peer: other kvtier instances' host memory as a tier, and serving ours to them.

Client side: ``tier`` (``PeerTier``), ``link`` (one peer's connection and handshake), ``probes``
(batched lookups). Server side: ``server`` (``PeerServer``, a manager service), ``server_holds``
(per-client slot holds with budgets and deadlines), ``server_transport`` (how it listens),
``host_view`` (what it may do with host memory). Both: ``config`` (the tier's and the server's
settings), ``protocol`` (messages and their validation), ``transport`` (the interface),
``zmq_transport`` and ``zmq_listener`` (ZeroMQ sockets), ``curve_keys`` (CURVE), and
``connection_bounds`` (bounding what a connection may send before it is buffered).

Nothing here is imported by ``import kvtier``: pyzmq is needed only when a peer tier or a peer
server is configured.
"""
