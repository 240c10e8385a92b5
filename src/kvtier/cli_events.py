"""``kvtier events``: print the KV events a publisher sends, one line per event.

Once the ZeroMQ handshake with the publisher has succeeded (so the subscription is on its way),
one line ``kvtier events: subscribed to ENDPOINT`` goes to stderr. A batch that cannot be
decoded or described is skipped with a warning on stderr; the command goes on with the next.
"""

from __future__ import annotations

import sys
from typing import Any

#: Longest part of a decoder's complaint repeated in a warning.
MAX_REASON_CHARS = 200


def follow(endpoint: str, topic: str, timeout_s: float | None) -> int:
    """Print batches from ``endpoint`` until ``timeout_s`` passes without one (or Ctrl-C)."""
    import zmq

    from kvtier.cli import UsageError

    context = zmq.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt_string(zmq.SUBSCRIBE, topic)
    monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    wait_ms = None if timeout_s is None else int(timeout_s * 1000)
    try:
        socket.connect(endpoint)
        if _connected(monitor, wait_ms):
            _say(f"subscribed to {endpoint}")
            _print_batches(socket, wait_ms)
        else:
            _say(f"no publisher answered at {endpoint} within {timeout_s:g} s")
    except zmq.ZMQError as exc:
        raise UsageError(f"argument --connect: cannot connect to {endpoint} ({exc})") from None
    except KeyboardInterrupt:
        pass
    finally:
        socket.disable_monitor()
        context.destroy(linger=0)
    return 0


def _connected(monitor: Any, wait_ms: int | None) -> bool:
    """Wait for the handshake event the monitor reports; ``False`` after ``wait_ms`` without."""
    from zmq.utils.monitor import recv_monitor_message

    if not monitor.poll(wait_ms):
        return False
    recv_monitor_message(monitor)  # the only event it was asked to report
    return True


def _print_batches(socket: Any, wait_ms: int | None) -> None:
    expected: int | None = None
    while socket.poll(wait_ms):
        expected = show_batch(socket.recv_multipart(), expected)


def show_batch(frames: list[bytes], expected: int | None) -> int | None:
    """Print one message ``[topic, seq (8 bytes), payload]``; the sequence number expected next.

    A message of another shape, or whose payload does not decode or describe, prints nothing
    on stdout and a warning on stderr.
    """
    if len(frames) != 3 or len(frames[1]) != 8:
        _say(f"skipped a malformed message ({len(frames)} frames)")
        return expected
    seq = int.from_bytes(frames[1], "big")
    lines = _describe(frames[2], seq)
    if expected is not None and seq != expected:
        print(f"! missed batches {expected}..{seq - 1}", flush=True)
    for line in lines:
        print(line, flush=True)
    return seq + 1


def _describe(payload: bytes, seq: int) -> list[str]:
    from kvtier.events import decode_batch, describe_wire

    try:
        _, events = decode_batch(payload)
        return [describe_wire(event) for event in events]
    except Exception as exc:  # a publisher's bytes may break the decoder in any way
        reason = f"{type(exc).__name__}: {exc}"[:MAX_REASON_CHARS]
        _say(f"skipped malformed batch {seq} ({reason})")
        return []


def _say(message: str) -> None:
    print(f"kvtier events: {message}", file=sys.stderr, flush=True)
