"""EventLog: one event per key in order, numbered by one, bounded by dropping the oldest."""

from __future__ import annotations

import os

from kvtier.keys import ChunkKey
from kvtier.telemetry.kv_events import EventKind, EventLog


def keys(n: int) -> list[ChunkKey]:
    return [ChunkKey(os.urandom(32)) for _ in range(n)]


def test_events_come_out_per_key_in_order_with_consecutive_numbers():
    log, stored, written = EventLog(outbox=True), keys(3), keys(2)
    log.add(EventKind.STORED, stored, "accelerator", "host")
    log.add(EventKind.WRITTEN, written, "host", "fs", "remote")
    events = log.take()
    assert [e.seq for e in events] == [0, 1, 2, 3, 4]
    assert [e.key for e in events] == stored + written
    assert events[3] == (3, EventKind.WRITTEN, written[0], "host", "fs", "remote")
    assert log.take() == [] and log.take_outbox() == events


def test_the_callers_list_can_change_after_add():
    log, batch = EventLog(), keys(2)
    log.add(EventKind.LOADED, batch, "host", "accelerator")
    first = list(batch)
    batch.clear()
    assert [e.key for e in log.take()] == first


def test_the_oldest_events_are_dropped_and_counted_even_inside_a_batch():
    log, older, newer = EventLog(max_events=5), keys(4), keys(3)
    log.add(EventKind.STORED, older, "accelerator", "host")
    log.add(EventKind.EVICTED, newer, "host", None)
    events = log.take()
    assert log.dropped == 2
    assert [e.key for e in events] == older[2:] + newer
    assert [e.seq for e in events] == [2, 3, 4, 5, 6]


def test_a_batch_larger_than_the_bound_keeps_its_newest_events():
    log, many = EventLog(max_events=3), keys(8)
    log.add(EventKind.STORED, many, "accelerator", "host")
    assert [e.key for e in log.take()] == many[5:] and log.dropped == 5
    log.add(EventKind.STORED, many[:1], "accelerator", "host")
    assert [e.seq for e in log.take()] == [8]
