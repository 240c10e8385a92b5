"""CircuitBreaker scenarios: a service that fails, stays down for a while, and comes back."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from kvtier.tiers.shared.circuit import CLOSED, OPEN, CircuitBreaker
from tests.conftest import wait_for


class Service:
    """A stand-in remote service: probes raise while ``up`` is False."""

    def __init__(self) -> None:
        self.up = False
        self.probes = 0
        self.closed_events = 0

    def probe(self) -> None:
        self.probes += 1
        if not self.up:
            raise ConnectionError("still down")

    def on_close(self) -> None:
        self.closed_events += 1


@pytest.fixture
def service() -> Service:
    return Service()


@pytest.fixture
def breaker(service: Service) -> Iterator[CircuitBreaker]:
    breaker = CircuitBreaker(
        "test",
        service.probe,
        failure_threshold=3,
        backoff_min_s=0.01,
        backoff_max_s=0.05,
        on_close=service.on_close,
    )
    yield breaker
    breaker.close()


def test_opens_only_after_consecutive_failures(breaker):
    """Two failures, a success, two failures: still closed; the third in a row opens it."""
    for _ in range(2):
        breaker.record_failure("boom")
    breaker.record_success()
    for _ in range(2):
        breaker.record_failure("boom")
    assert breaker.allow() and breaker.state == CLOSED
    breaker.record_failure("boom")
    assert not breaker.allow() and breaker.state == OPEN and breaker.num_opened == 1


def test_probes_until_the_service_is_back_then_closes(breaker, service):
    """While down, probes keep failing and the circuit stays open; once up, one probe closes it."""
    breaker.trip("down at start")
    wait_for(lambda: service.probes >= 3)
    assert breaker.state == OPEN and service.closed_events == 0
    service.up = True
    wait_for(lambda: breaker.state == CLOSED)
    assert service.closed_events == 1


def test_reopens_after_recovery_and_counts_each_opening(breaker, service):
    service.up = True
    breaker.trip("first outage")
    wait_for(lambda: breaker.allow())
    service.up = False  # the second outage lasts until the test says so
    for _ in range(3):
        breaker.record_failure("second outage")
    assert not breaker.allow()
    service.up = True
    wait_for(lambda: breaker.allow())
    assert breaker.num_opened == 2 and service.closed_events == 2


def test_close_joins_the_probe_thread_even_while_open(service):
    before = set(threading.enumerate())
    breaker = CircuitBreaker("test", service.probe, backoff_min_s=10.0, backoff_max_s=10.0)
    breaker.trip("down")
    breaker.close()
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []


def test_backoff_doubles_up_to_its_maximum_and_resets():
    from kvtier.tiers.shared.circuit import Backoff

    backoff = Backoff(0.2, 1.0)
    assert [backoff.next_delay() for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    backoff.reset()
    assert backoff.next_delay() == 0.2
    backoff.give_up()
    assert backoff.next_delay() == 1.0
