"""WorkerPool: callables in order on daemon threads started as work comes; a close that returns
whatever a callable does."""

from __future__ import annotations

import threading

import pytest

from kvtier.tiers.shared.workers import WorkerPool
from tests.conftest import wait_for


def blocked_pool(size: int, busy: int) -> tuple[WorkerPool, threading.Event, list[str]]:
    """A pool of ``size`` whose first ``busy`` callables wait for the returned event."""
    pool, release, entered = WorkerPool(size, "test"), threading.Event(), []
    for _ in range(busy):
        pool.submit(lambda: (entered.append(threading.current_thread().name), release.wait(30)))
    wait_for(lambda: len(entered) == min(busy, size), what="workers busy")
    return pool, release, entered


def test_threads_start_as_work_comes_and_never_exceed_the_size():
    pool, release, entered = blocked_pool(2, 3)
    assert sorted(entered) == ["test_0", "test_1"], "the third waits for a free worker"
    release.set()
    wait_for(lambda: len(entered) == 3, what="the third callable")
    assert set(entered) <= {"test_0", "test_1"}
    assert pool.close(5) == []


def test_an_idle_worker_takes_the_next_callable_before_a_new_thread_starts():
    pool, done = WorkerPool(4, "test"), []
    for i in range(5):
        pool.submit(lambda i=i: done.append((i, threading.current_thread().name)))
        wait_for(lambda i=i: len(done) == i + 1, what=f"callable {i}")
    assert {name for _, name in done} == {"test_0"}
    assert pool.close(5) == []


@pytest.mark.parametrize(("cancel", "expected"), [(False, 4), (True, 0)])
def test_close_runs_what_is_queued_unless_cancelled(cancel, expected):
    pool, release, _ = blocked_pool(1, 1)
    ran: list[int] = []
    for i in range(4):
        pool.submit(lambda i=i: ran.append(i))
    closer = threading.Thread(target=pool.close, args=(10, cancel))
    closer.start()
    wait_for(lambda: pool.submit(lambda: None) is False, what="closed")
    release.set()
    closer.join(30)
    assert not closer.is_alive()
    assert ran == list(range(expected))


def test_close_returns_the_workers_still_busy_after_its_timeout_and_leaves_them_daemon():
    pool, release, _ = blocked_pool(2, 2)
    busy = pool.close(0.2)
    assert sorted(busy) == ["test_0", "test_1"]
    stuck = [t for t in threading.enumerate() if t.name in busy]
    assert stuck and all(t.daemon for t in stuck), "a stuck worker never holds the process"
    release.set()
    for thread in stuck:
        thread.join(30)
    assert not any(t.is_alive() for t in stuck), "released, they still stop"
    assert pool.close(5) == [], "idempotent"


def test_nothing_is_queued_after_close():
    pool = WorkerPool(1, "test")
    assert pool.close(5) == []
    ran: list[int] = []
    assert pool.submit(lambda: ran.append(1)) is False
    assert ran == []


def test_a_raising_callable_is_logged_and_the_worker_goes_on(caplog):
    pool, ran = WorkerPool(1, "test"), []
    pool.submit(lambda: 1 / 0)
    pool.submit(lambda: ran.append(1))
    wait_for(lambda: ran == [1], what="the next callable")
    assert "a task failed" in caplog.text and "ZeroDivisionError" in caplog.text
    assert pool.close(5) == []


@pytest.mark.parametrize("size", [0, -3])
def test_a_pool_has_at_least_one_worker(size):
    pool, ran = WorkerPool(size, "test"), []
    pool.submit(lambda: ran.append(1))
    wait_for(lambda: ran == [1], what="the callable")
    assert pool.close(5) == []
