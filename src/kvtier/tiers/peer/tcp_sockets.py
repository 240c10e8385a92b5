"""The sockets of ``TcpTransport``: non-blocking, without Nagle's delay, with keepalive probes;
and host names resolved without stalling the transport's thread.

Thread safety: plain functions; ``resolve`` starts a thread of its own for a host name.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from kvtier.tiers.peer.transport import KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES

#: Linux's socket options for ``transport``'s keepalive settings.
KEEPALIVE = {
    "TCP_KEEPIDLE": KEEPALIVE_IDLE_S,
    "TCP_KEEPINTVL": KEEPALIVE_INTERVAL_S,
    "TCP_KEEPCNT": KEEPALIVE_PROBES,
}
#: Longest the owner's thread waits for a host name to resolve (an IP address never waits).
RESOLVE_TIMEOUT_S = 2.0
_STREAM = socket.SOCK_STREAM


def stream(family: int, kind: int, proto: int) -> socket.socket:
    return nonblocking(socket.socket(family, kind, proto))


def nonblocking(sock: socket.socket) -> socket.socket:
    """``sock`` non-blocking, without Nagle's delay, and with keepalive probes (``KEEPALIVE``):
    a connection whose peer vanished fails, and is dropped like any broken one."""
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in KEEPALIVE.items():
        if hasattr(socket, name):  # Linux's names; elsewhere the system's defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    return sock


def resolve(host: str, port: int) -> list[tuple[int, Any]] | str:
    """The ``(family, address)`` pairs of ``host:port``, or why there are none. An IP address
    is read at once; a name is resolved on a thread of its own for at most
    ``RESOLVE_TIMEOUT_S``, so a resolver that hangs never stalls the transport's thread for
    longer."""
    try:
        return pairs(socket.getaddrinfo(host, port, 0, _STREAM, 0, socket.AI_NUMERICHOST))
    except (OSError, UnicodeError):
        pass
    answer: list[list[tuple[int, Any]] | str] = []

    def lookup() -> None:
        try:
            answer.append(pairs(socket.getaddrinfo(host, port, 0, _STREAM)))
        except (OSError, UnicodeError) as exc:
            answer.append(str(exc))

    thread = threading.Thread(target=lookup, name="kvtier-peer-resolve", daemon=True)
    thread.start()
    thread.join(RESOLVE_TIMEOUT_S)
    return answer[0] if answer else f"no answer within {RESOLVE_TIMEOUT_S:g} s"


def pairs(infos: list[Any]) -> list[tuple[int, Any]]:
    pairs: list[tuple[int, Any]] = []
    for family, _, _, _, address in infos:
        if (family, address) not in pairs:
            pairs.append((family, address))
    return pairs
