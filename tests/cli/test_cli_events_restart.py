"""``kvtier events`` when its publisher restarts (issue 25, finding 7): the batch numbers start
over at 0, and the command says so in one line instead of "missed batches 7..-1".

The end-to-end test runs two of kvtier's real publishers (``EventPublisher``), one after the
other, on the same endpoint, and ``kvtier events`` in a child process subscribed to it.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time

import msgpack
import pytest

from kvtier.cli.events import show_batch
from kvtier.keys import ChunkKey
from kvtier.telemetry.kv_events import EventKind, EventPublisher, KVEvent
from tests.child_process import child_env
from tests.conftest import has_output, read_line

CLI = [sys.executable, "-m", "kvtier.cli", "events"]
#: Batches the first publisher sends after the subscriber got one: more than the second one can
#: send (one per 0.3 s) in ``LINE_TIMEOUT_S``, so its first batch to arrive numbers below.
FIRST_RUN_BATCHES = 200
LINE_TIMEOUT_S = 30.0


def frames(seq: int) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), msgpack.packb([1.0, []])]


@pytest.mark.parametrize(
    ("last", "seq", "line"),
    [
        (7, 0, "! publisher restarted (seq 7 -> 0)"),
        (3, 3, "! publisher restarted (seq 3 -> 3)"),  # restarted, and sent as many again
        (7, 9, "! missed batches 8..8"),
    ],
)
def test_a_batch_out_of_sequence_prints_one_line_saying_why(capsys, last, seq, line):
    assert show_batch(frames(last), None) == last + 1
    assert show_batch(frames(seq), last + 1) == seq + 1
    assert capsys.readouterr().out.splitlines() == [line]


def test_no_line_for_batches_in_sequence(capsys):
    expected = None
    for seq in (0, 1, 2):
        expected = show_batch(frames(seq), expected)
    assert capsys.readouterr().out == ""


def publish(publisher: EventPublisher, seq: int) -> None:
    """One batch of one event, numbered like the batch (both count from 0 per publisher)."""
    publisher.publish(
        [KVEvent(seq, EventKind.STORED, ChunkKey(bytes(32)), "accelerator", "host")], 16
    )


def publish_until_printed(
    publisher: EventPublisher, printer: subprocess.Popen[bytes]
) -> tuple[int, str]:
    """Publish batches 0, 1, ... until the printer prints; (batches published, its first line).

    ZeroMQ drops what a publisher sends before the subscription reaches it (slow joiner), so
    the first batches may be lost; every batch after the first one that arrives does arrive.
    """
    assert printer.stdout is not None
    deadline = time.monotonic() + LINE_TIMEOUT_S
    for seq in itertools.count():
        publish(publisher, seq)
        if has_output(printer.stdout, 0.3):
            return seq + 1, read_line(printer, LINE_TIMEOUT_S, "a first line").decode()
        assert time.monotonic() < deadline, "no batch reached kvtier events"
    raise AssertionError("unreachable")


def lines_through(printer: subprocess.Popen[bytes], seq: int) -> list[str]:
    """The lines printed up to and including event ``seq``'s."""
    printed: list[str] = []
    while not (printed and printed[-1].startswith(f"#{seq} ")):
        assert len(printed) <= 2 * FIRST_RUN_BATCHES, printed[-3:]
        printed.append(read_line(printer, LINE_TIMEOUT_S, f"the line of event {seq}").decode())
    return printed


def numbers(lines: list[str]) -> list[int]:
    """The event numbers of event lines (``#12 stored ...``); a line of another kind fails."""
    assert all(line.startswith("#") for line in lines), lines
    return [int(line.split()[0][1:]) for line in lines]


def bind_again(endpoint: str) -> EventPublisher:
    """A new publisher on ``endpoint``, retried while the old socket's port is released."""
    zmq = pytest.importorskip("zmq")
    deadline = time.monotonic() + LINE_TIMEOUT_S
    while True:
        try:
            return EventPublisher(endpoint)
        except zmq.ZMQError:
            assert time.monotonic() < deadline, f"could not bind {endpoint} again"
            time.sleep(0.1)


def test_kvtier_events_says_the_publisher_restarted_when_its_numbers_start_over():
    pytest.importorskip("zmq")
    first = EventPublisher("tcp://127.0.0.1:*")
    endpoint = first.endpoint
    printer = subprocess.Popen(
        [*CLI, "--connect", endpoint, "--timeout", "120"],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        said = read_line(printer, 60, "kvtier events to subscribe", printer.stderr)
        assert said == f"kvtier events: subscribed to {endpoint}".encode()
        published, line = publish_until_printed(first, printer)
        last = published + FIRST_RUN_BATCHES - 1
        for seq in range(published, last + 1):
            publish(first, seq)
        before = [line, *lines_through(printer, last)]
        first.close()

        second = bind_again(endpoint)  # a restarted publisher: numbers from 0 again
        try:
            published, said_restart = publish_until_printed(second, printer)
            for seq in (published, published + 1):
                publish(second, seq)
            after = lines_through(printer, published + 1)
        finally:
            second.close()
    finally:
        printer.terminate()
        _, errors = printer.communicate(timeout=30)
    assert numbers(before) == list(range(numbers(before)[0], last + 1))
    restart = numbers(after)[0]
    assert restart < last, "the second publisher's first batch must number below the last"
    assert said_restart == f"! publisher restarted (seq {last} -> {restart})"
    assert numbers(after) == list(range(restart, published + 2))
    assert b"missed" not in errors
