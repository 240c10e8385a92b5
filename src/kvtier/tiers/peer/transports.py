"""The transport a peer configuration's ``transport`` names, for the tier and the server alike.

Runs on the thread that builds the tier or the server.
"""

from __future__ import annotations

from kvtier.tiers.peer.curve_keys import CurveClient, CurveServer
from kvtier.tiers.peer.tcp_transport import TcpTransport
from kvtier.tiers.peer.transport import Transport
from kvtier.tiers.peer.zmq_transport import ZmqTransport


def transport_for(
    kind: str, *, client: CurveClient | None = None, server: CurveServer | None = None
) -> Transport:
    """Plain TCP for ``"tcp"`` (the configuration refuses CURVE keys with it), else ZeroMQ
    with the CURVE keys given."""
    if kind == "tcp":
        return TcpTransport()
    return ZmqTransport(curve_client=client, curve_server=server)
