"""``kvtier events``: print the KV events a publisher sends, one line per event.

Two publishers are understood, both in vLLM 0.32's wire format
(``kvtier.telemetry.kv_events``): kvtier's own, whose events carry ``seq`` and ``kind``
(``kv_events.describe_wire`` writes their line, e.g.
``#12 written   host -> fs   STORAGE key=ab12cd34ef56``), and vLLM's own, which do not::

    stored   GPU      blocks=7 tokens=896 hashes=7f3a09c1d2e4b5a6,... [parent=...]
    removed  CPU      blocks=1 hashes=7f3a09c1d2e4b5a6 [owner=fs locality=LOCAL]
    cleared  -        all blocks

``medium`` is vLLM's (``GPU``, ``CPU``, ``STORAGE``; ``-`` when unset); ``tokens`` counts the
event's token ids, or blocks times ``block_size`` when it carries none, and is ``?`` when it
carries neither (vLLM's placeholder offload events). A hash is shown in hex: an integer one
(vLLM's default) as 16 digits, a bytes one by its first 16. ``parent``, ``owner`` (the
secondary tier), ``locality``, ``lora`` and ``group`` (a KV cache group other than 0) appear
when the event has them. A type this command does not know prints as ``? TYPE``. Control
characters a publisher sends in a string are printed escaped.

Once the ZeroMQ handshake with the publisher has succeeded (so the subscription is on its way),
one line ``kvtier events: subscribed to ENDPOINT`` goes to stderr. A batch that cannot be
decoded or described is skipped with a warning on stderr; the command goes on with the next.
Batch numbers that skip print ``! missed batches A..B``; numbers that go back (a publisher that
restarted counts from 0 again) print ``! publisher restarted (seq LAST -> SEQ)``. A lost
connection prints ``kvtier events: lost the connection to ENDPOINT (...); connecting again``.

What a publisher can make this command buffer is bounded by frame (``MAX_FRAME_BYTES``: a larger
frame drops the connection unread, and the command connects again) and by queued message
(``MAX_QUEUED``). libzmq does not bound the number of frames of one message
(see ``kvtier.tiers.peer.connection_bounds``): a hostile publisher can still grow it that way.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Mapping
from typing import Any

#: Longest part of a decoder's complaint repeated in a warning.
MAX_REASON_CHARS = 200
#: Largest frame taken from a publisher (libzmq's ``MAXMSGSIZE``): a larger one drops the
#: connection before it is buffered, and the subscriber connects again. kvtier's largest batch
#: (100,000 events) is about 25 MiB.
MAX_FRAME_BYTES = 64 << 20
#: Whole messages libzmq queues for this command (``RCVHWM``); more are dropped (and printed
#: as missed batches) while the terminal does not keep up.
MAX_QUEUED = 16

#: vLLM's event type -> the verb a line starts with.
VERBS = {"BlockStored": "stored", "BlockRemoved": "removed", "AllBlocksCleared": "cleared"}


def follow(endpoint: str, topic: str, timeout_s: float | None) -> int:
    """Print batches from ``endpoint`` until ``timeout_s`` passes without one (or Ctrl-C).

    Returns 0, or 1 when no publisher answered the connection within ``timeout_s`` (said on
    stderr); ``None`` waits for ever, for the publisher and between batches.
    """
    import zmq

    from kvtier.cli.common import UsageError

    context = zmq.Context()
    socket = _subscriber(context, topic)
    monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
    wait_ms = None if timeout_s is None else int(timeout_s * 1000)
    try:
        socket.connect(endpoint)
        if not _connected(monitor, wait_ms):
            _say(f"no publisher answered at {endpoint} within {timeout_s:g} s")
            return 1
        _say(f"subscribed to {endpoint}")
        _print_batches(socket, monitor, endpoint, wait_ms)
    except zmq.ZMQError as exc:
        raise UsageError(f"argument --connect: cannot connect to {endpoint} ({exc})") from None
    except KeyboardInterrupt:
        pass
    finally:
        socket.disable_monitor()
        context.destroy(linger=0)
    return 0


def _subscriber(context: Any, topic: str) -> Any:
    """A SUB socket on ``topic``, bounded in what a publisher can make it buffer."""
    import zmq

    socket = context.socket(zmq.SUB)
    bounds = ((zmq.LINGER, 0), (zmq.MAXMSGSIZE, MAX_FRAME_BYTES), (zmq.RCVHWM, MAX_QUEUED))
    for option, value in bounds:
        socket.setsockopt(option, value)
    socket.setsockopt_string(zmq.SUBSCRIBE, topic)
    return socket


def _connected(monitor: Any, wait_ms: int | None) -> bool:
    """Wait for a handshake the monitor reports; ``False`` after ``wait_ms`` without one."""
    deadline = _deadline(wait_ms)
    while monitor.poll(_left_ms(deadline)):
        if _event(monitor) == "HANDSHAKE_SUCCEEDED":
            return True
    return False


def _print_batches(socket: Any, monitor: Any, endpoint: str, wait_ms: int | None) -> None:
    """Print batches until ``wait_ms`` pass without one; connect again whenever the
    connection is lost."""
    import zmq

    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    expected: int | None = None
    deadline = _deadline(wait_ms)
    while ready := dict(poller.poll(_left_ms(deadline))):
        if monitor in ready and _event(monitor) == "DISCONNECTED":
            _reconnect(socket, endpoint)
        if socket in ready:
            expected = show_batch(socket.recv_multipart(), expected)
            deadline = _deadline(wait_ms)


def _reconnect(socket: Any, endpoint: str) -> None:
    """Connect ``socket`` to ``endpoint`` anew: libzmq does not after a protocol error (a frame
    over ``MAX_FRAME_BYTES``), only after the publisher went away."""
    import zmq

    why = f"the publisher left, or sent a frame over {MAX_FRAME_BYTES >> 20} MiB"
    _say(f"lost the connection to {endpoint} ({why}); connecting again")
    with contextlib.suppress(zmq.ZMQError):  # no longer connected at all
        socket.disconnect(endpoint)
    socket.connect(endpoint)


def _event(monitor: Any) -> str:
    """The name of the next event the monitor reports (``DISCONNECTED``, ...)."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    return str(zmq.Event(recv_monitor_message(monitor)["event"]).name)


def _deadline(wait_ms: int | None) -> float | None:
    return None if wait_ms is None else time.monotonic() + wait_ms / 1000


def _left_ms(deadline: float | None) -> int | None:
    """Milliseconds to ``deadline`` (0 once past it; ``None``: no deadline)."""
    return None if deadline is None else max(0, math.ceil((deadline - time.monotonic()) * 1000))


def show_batch(frames: list[bytes], expected: int | None) -> int | None:
    """Print one message ``[topic, seq (8 bytes), payload]``; the sequence number expected next.

    Before its lines, a message that does not follow the last one prints ``! missed batches
    A..B`` (numbers skipped) or ``! publisher restarted (seq LAST -> SEQ)`` (numbers went
    back: a restarted publisher counts from 0 again). A message of another shape, or whose
    payload does not decode or describe, prints nothing on stdout and a warning on stderr.
    """
    if len(frames) != 3 or len(frames[1]) != 8:
        _say(f"skipped a malformed message ({len(frames)} frames)")
        return expected
    seq = int.from_bytes(frames[1], "big")
    lines = _describe(frames[2], seq)
    gap = _gap(expected, seq)
    for line in [gap, *lines] if gap else lines:
        print(line, flush=True)
    return seq + 1


def _gap(expected: int | None, seq: int) -> str | None:
    """The line that says batch ``seq`` does not follow the last one, or ``None`` if it does.

    A number past ``expected`` means batches were missed; one below it (the last seen, or
    lower) means the publisher restarted and numbers from 0 again.
    """
    if expected is None or seq == expected:
        return None
    if seq < expected:
        return f"! publisher restarted (seq {expected - 1} -> {seq})"
    return f"! missed batches {expected}..{seq - 1}"


def _describe(payload: bytes, seq: int) -> list[str]:
    from kvtier.telemetry.kv_events import decode_batch

    try:
        _, events = decode_batch(payload)
        return [describe(event) for event in events]
    except Exception as exc:  # a publisher's bytes may break the decoder in any way
        reason = f"{type(exc).__name__}: {exc}"[:MAX_REASON_CHARS]
        _say(f"skipped malformed batch {seq} ({reason})")
        return []


def describe(event: Mapping[str, Any]) -> str:
    """One line for a wire event: kvtier's own (it has ``seq`` and ``kind``) as
    ``events.describe_wire`` writes it, any other as ``describe_vllm`` does."""
    from kvtier.telemetry.kv_events import describe_wire

    line = describe_wire(event) if "seq" in event and "kind" in event else describe_vllm(event)
    return _printable(line)


def _printable(text: str) -> str:
    """``text`` with control characters escaped: a publisher cannot drive the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def describe_vllm(event: Mapping[str, Any]) -> str:
    """One line for an event of vLLM's own (see the module docstring for its shape)."""
    tag = str(event.get("type"))
    verb = VERBS.get(tag)
    if verb is None:
        return f"? {tag[:MAX_REASON_CHARS]}"
    if verb == "cleared":
        return f"{verb:<8} {'-':<8} all blocks"
    hashes = _items(event.get("block_hashes"))
    medium = str(event.get("medium") or "-")[:32]
    line = f"{verb:<8} {medium:<8} blocks={len(hashes)}"
    if verb == "stored":
        line += f" tokens={_tokens(event, len(hashes))}"
    return " ".join([line, "hashes=" + ",".join(map(_hash, hashes)), *_extras(event)])


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _tokens(event: Mapping[str, Any], blocks: int) -> str:
    """The tokens a store covers: its token ids, else blocks of ``block_size``; ``?``: unknown."""
    ids = _items(event.get("token_ids"))
    if ids:
        return str(len(ids))
    size = event.get("block_size")
    return str(blocks * size) if type(size) is int and size > 0 else "?"


def _hash(value: Any) -> str:
    """A block hash in hex: an integer as 16 digits (two's complement), bytes by the first 16."""
    if isinstance(value, bytes):
        return value.hex()[:16]
    if type(value) is int:
        return f"{value & (2**64 - 1):016x}"
    return str(value)[:16]


def _extras(event: Mapping[str, Any]) -> list[str]:
    """``key=value`` for what the event has beyond its type, medium, hashes and tokens."""
    extras = []
    if event.get("parent_block_hash") is not None:
        extras.append(f"parent={_hash(event['parent_block_hash'])}")
    for key, label in (("ownership", "owner"), ("locality", "locality"), ("lora_name", "lora")):
        if event.get(key):
            extras.append(f"{label}={str(event[key])[:64]}")
    if event.get("group_idx"):
        extras.append(f"group={str(event['group_idx'])[:16]}")
    return extras


def _say(message: str) -> None:
    print(f"kvtier events: {message}", file=sys.stderr, flush=True)
