"""A hostile peer-server client in its own process, speaking raw ZMTP 3.0 (NULL) over TCP.

``python -m tests.tiers.peer.hostile_client PORT MODE`` connects, sends the ZMTP greeting and READY as
a DEALER would, then:

* ``endless``: frames that all say "more", forever (a message that never ends);
* ``million``: one message of a million empty frames, then it idles (reading only to notice
  that the server cut it off).

Whenever the server cuts the connection it connects again and starts over, until killed. libzmq
itself never sends a message before its last frame, hence raw TCP.
"""

from __future__ import annotations

import socket
import struct
import sys
import time

EMPTY_MORE = b"\x01\x00"  # ZMTP short frame: flags MORE, size 0
EMPTY_LAST = b"\x00\x00"


def connect(port: int) -> socket.socket:
    """A TCP connection that has done the ZMTP 3.0 NULL handshake of a DEALER."""
    sock = socket.create_connection(("127.0.0.1", port))
    signature = b"\xff" + bytes(8) + b"\x7f"
    sock.sendall(signature + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\x00" + bytes(31))
    greeting = b""
    while len(greeting) < 64:
        part = sock.recv(64 - len(greeting))
        if not part:
            raise ConnectionError("the server closed the connection during the greeting")
        greeting += part
    socket_type = b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    ready = b"\x05READY" + socket_type
    sock.sendall(b"\x04" + bytes([len(ready)]) + ready)
    return sock


def endless(sock: socket.socket) -> None:
    block = EMPTY_MORE * 65536
    while True:
        sock.sendall(block)


def million(sock: socket.socket) -> None:
    sock.sendall(EMPTY_MORE * 999_999 + EMPTY_LAST)
    while sock.recv(1 << 16):  # idle until the server cuts us off
        pass


def main() -> None:
    port, mode = int(sys.argv[1]), sys.argv[2]
    attack = {"endless": endless, "million": million}[mode]
    while True:
        try:
            attack(connect(port))
        except OSError:
            time.sleep(0.01)  # cut off: start over


if __name__ == "__main__":
    main()
