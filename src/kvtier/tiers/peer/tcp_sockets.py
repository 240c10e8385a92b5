"""The sockets of ``TcpTransport``: non-blocking, without Nagle's delay, with keepalive probes;
and host names resolved without stalling the transport's thread (``Resolver``).

Thread safety: plain functions; a ``Resolver`` belongs to the transport's thread, and its
lookups run on threads of their own (they only put their answer on a queue, and wake it).
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
#: Names a transport looks up at once at most (a peer tier keeps 64 peers at most).
MAX_RESOLVING = 64
#: How long the addresses a name resolved to are used without asking again.
RESOLVED_TTL_S = 60.0
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
Name = tuple[str, int]  # host, port


class Resolver:
    """Resolves host names on threads of their own, so that a resolver that hangs never stalls
    the transport's thread: ``start`` returns at once, and ``take`` (the transport's thread)
    collects the answers; ``wake`` is called (from the resolving thread) as each arrives.

    A token not answered within ``RESOLVE_TIMEOUT_S`` gets that as its answer. One lookup runs
    per name, whoever asks meanwhile waits for it, and its addresses are kept for
    ``RESOLVED_TTL_S``: a link that gave up on a slow lookup finds the answer when it tries
    again. At most ``MAX_RESOLVING`` names are looked up at once, so threads stuck in a
    resolver that never answers are not started without end (``start`` is then ``False``).
    """

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._answers: queue.SimpleQueue[tuple[Name, Answer]] = queue.SimpleQueue()
        self._due: dict[int, tuple[object, Name, float]] = {}  # id(token) -> it, name, deadline
        self._running: set[Name] = set()  # names with a lookup out
        self._known: dict[Name, tuple[Answer, float]] = {}  # addresses found -> until when
        self._ready: list[tuple[object, Answer]] = []  # answered from ``_known``

    def start(self, token: object, host: str, port: int) -> bool:
        """Look ``host:port`` up for ``token``; ``False`` when too many lookups are running."""
        name, now = (host, port), time.monotonic()
        answer, until = self._known.get(name, ("", 0.0))
        if now < until:
            self._ready.append((token, answer))
            self._wake()
            return True
        if name not in self._running:
            if len(self._running) >= MAX_RESOLVING:
                return False
            self._running.add(name)
            lookup = functools.partial(self._lookup, name)
            threading.Thread(target=lookup, name="kvtier-peer-resolve", daemon=True).start()
        self._due[id(token)] = (token, name, now + RESOLVE_TIMEOUT_S)
        return True

    def _lookup(self, name: Name) -> None:
        """On the lookup's own thread."""
        try:
            answer: Answer = pairs(socket.getaddrinfo(*name, 0, _STREAM))
        except (OSError, UnicodeError) as exc:
            answer = str(exc)
        self._answers.put((name, answer))
        self._wake()

    def waiting(self) -> list[object]:
        """The tokens whose answer has not been taken yet."""
        return [token for token, _, _ in self._due.values()] + [t for t, _ in self._ready]

    def take(self) -> list[tuple[object, Answer]]:
        """Answers that arrived, and lookups past their deadline, each token once."""
        taken, self._ready = self._ready, []
        now = time.monotonic()
        while not self._answers.empty():
            name, answer = self._answers.get_nowait()
            self._running.discard(name)
            if not isinstance(answer, str):
                self._known[name] = (answer, now + RESOLVED_TTL_S)
            taken += self._pop_due(functools.partial(_same_name, name), answer)
        expired = f"no answer within {RESOLVE_TIMEOUT_S:g} s"
        taken += self._pop_due(lambda _, deadline: now >= deadline, expired)
        if len(self._known) > MAX_RESOLVING:
            self._known = {n: k for n, k in self._known.items() if now < k[1]}
        return taken

    def _pop_due(self, chosen: Callable[[Name, float], bool], answer: Answer) -> list[Any]:
        """The due tokens ``chosen`` picks, each with ``answer``, no longer due."""
        picked = [(key, token) for key, (token, n, d) in self._due.items() if chosen(n, d)]
        for key, _ in picked:
            del self._due[key]
        return [(token, answer) for _, token in picked]


def _same_name(asked: Name, name: Name, deadline: float) -> bool:
    return name == asked


def pairs(infos: list[Any]) -> list[tuple[int, Any]]:
    pairs: list[tuple[int, Any]] = []
    for family, _, _, _, address in infos:
        if (family, address) not in pairs:
            pairs.append((family, address))
    return pairs
