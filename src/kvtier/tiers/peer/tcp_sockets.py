"""The sockets of ``TcpTransport``: non-blocking, without Nagle's delay, with keepalive probes;
and host names resolved without stalling the transport's thread (``Resolver``).

Thread safety: plain functions; a ``Resolver`` belongs to the transport's thread, and its
lookups run on threads of their own.
"""

from __future__ import annotations

import functools
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kvtier.tiers.peer.transport import KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES

#: Linux's socket options for ``transport``'s keepalive settings.
KEEPALIVE = {
    "TCP_KEEPIDLE": KEEPALIVE_IDLE_S,
    "TCP_KEEPINTVL": KEEPALIVE_INTERVAL_S,
    "TCP_KEEPCNT": KEEPALIVE_PROBES,
}
#: Longest a channel waits for its host name to resolve (an IP address never waits); the
#: transport's thread never waits for it.
RESOLVE_TIMEOUT_S = 5.0
#: Names a transport looks up at once at most.
MAX_RESOLVING = 4
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


def numeric(host: str, port: int) -> list[tuple[int, Any]] | None:
    """The ``(family, address)`` pairs of ``host:port`` if ``host`` is an IP address (read at
    once, no resolver asked), else ``None``."""
    try:
        return pairs(socket.getaddrinfo(host, port, 0, _STREAM, 0, socket.AI_NUMERICHOST))
    except (OSError, UnicodeError):
        return None


Answer = list[tuple[int, Any]] | str  # the addresses of a name, or why there are none


class Resolver:
    """Resolves host names on threads of their own, so that a resolver that hangs never stalls
    the transport's thread: ``start`` returns at once, and ``take`` (the transport's thread)
    collects the answers. ``wake`` is called (from the resolving thread) as each arrives; one
    not in within ``RESOLVE_TIMEOUT_S`` is an answer of its own (``expired``). At most
    ``MAX_RESOLVING`` names are looked up at once: threads stuck in a resolver that never
    answers are not started without end (``start`` is then ``False``).
    """

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._answers: queue.SimpleQueue[tuple[object, Answer]] = queue.SimpleQueue()
        self._due: dict[int, tuple[object, float]] = {}  # id(token) -> (token, deadline)
        self._running = 0
        self._lock = threading.Lock()

    def start(self, token: object, host: str, port: int) -> bool:
        """Look ``host:port`` up for ``token``; ``False`` when too many lookups are running."""
        with self._lock:
            if self._running >= MAX_RESOLVING:
                return False
            self._running += 1
        self._due[id(token)] = (token, time.monotonic() + RESOLVE_TIMEOUT_S)
        lookup = functools.partial(self._lookup, token, host, port)
        threading.Thread(target=lookup, name="kvtier-peer-resolve", daemon=True).start()
        return True

    def _lookup(self, token: object, host: str, port: int) -> None:
        try:
            answer: Answer = pairs(socket.getaddrinfo(host, port, 0, _STREAM))
        except (OSError, UnicodeError) as exc:
            answer = str(exc)
        with self._lock:
            self._running -= 1
        self._answers.put((token, answer))
        self._wake()

    def waiting(self) -> list[object]:
        """The tokens whose answer has not been taken yet."""
        return [token for token, _ in self._due.values()]

    def take(self) -> list[tuple[object, Answer]]:
        """Answers that arrived, and lookups past their deadline, each token once."""
        taken = []
        while not self._answers.empty():
            token, answer = self._answers.get_nowait()
            if self._due.pop(id(token), None) is not None:
                taken.append((token, answer))
        now = time.monotonic()
        for key, (token, deadline) in list(self._due.items()):
            if now >= deadline:
                del self._due[key]
                taken.append((token, f"no answer within {RESOLVE_TIMEOUT_S:g} s"))
        return taken


def pairs(infos: list[Any]) -> list[tuple[int, Any]]:
    pairs: list[tuple[int, Any]] = []
    for family, _, _, _, address in infos:
        if (family, address) not in pairs:
            pairs.append((family, address))
    return pairs
