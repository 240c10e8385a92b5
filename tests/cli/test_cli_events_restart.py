"""``kvtier events`` when its publisher restarts (issue 25, finding 7): the batch numbers start
over at 0, and the command says so in one line instead of "missed batches 7..-1".

The end-to-end test runs two of kvtier's real publishers (``EventPublisher``), one after the
other, on the same endpoint, and ``kvtier events`` in a child process subscribed to it.
"""

from __future__ import annotations

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
#: Batches the first publisher sends after the subscriber got one: the second publisher's first
#: batch to arrive is numbered well below this, whatever its subscription's slow join loses.
FIRST_RUN_BATCHES = 100
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


def first_arrival(publisher: EventPublisher, printer: subprocess.Popen[bytes]) -> int:
    """Publish until the printer prints; the number of the batch that arrived first.

    ZeroMQ drops what a publisher sends before the subscription reaches it (slow joiner), so
    the first batches may be lost; every batch after the first one that arrives does arrive.
    """
    assert printer.stdout is not None
    deadline = time.monotonic() + LINE_TIMEOUT_S
    for seq in range(10_000):
        publish(publisher, seq)
        if has_output(printer.stdout, 0.3):
            return seq
        assert time.monotonic() < deadline, "no batch reached kvtier events"
    raise AssertionError("unreachable")


def lines(printer: subprocess.Popen[bytes], n: int) -> list[str]:
    return [read_line(printer, LINE_TIMEOUT_S, f"line {i}").decode() for i in range(n)]


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
        start = first_arrival(first, printer)
        for seq in range(start + 1, start + 1 + FIRST_RUN_BATCHES):
            publish(first, seq)
        before = lines(printer, 1 + FIRST_RUN_BATCHES)
        last = start + FIRST_RUN_BATCHES
        first.close()

        second = bind_again(endpoint)  # a restarted publisher: numbers from 0 again
        try:
            restart = first_arrival(second, printer)
            for seq in range(restart + 1, restart + 3):
                publish(second, seq)
            after = lines(printer, 4)
        finally:
            second.close()
    finally:
        printer.terminate()
        _, errors = printer.communicate(timeout=30)
    assert [line.split()[0] for line in before] == [f"#{s}" for s in range(start, last + 1)]
    assert restart < last, "the second publisher's first batch must number below the last"
    assert after[0] == f"! publisher restarted (seq {last} -> {restart})"
    assert [line.split()[:2] for line in after[1:]] == [
        [f"#{s}", "stored"] for s in range(restart, restart + 3)
    ]
    assert b"missed" not in errors
