"""Misuse of ``TieringManager`` in every order, on host memory and a real fs tier.

Each test is a misuse that once went wrong: keys that are not a sequence (a generator read once
by the entry check, so ``complete_store`` completed nothing and left the slots being written for
good), keys that are not 32 bytes long, a malformed ``parent`` that failed the fs write in the
tier's thread (or silently wrote a garbled link), a NaN timeout that no deadline reaches, and a
second ``close`` from another thread that returned while the first still drained the tiers.
Every misuse must raise a kvtier error at the call and leave the manager as it was.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from kvtier import ChunkKey, TieringConfig, TieringManager
from kvtier.config import FsTierConfig
from kvtier.errors import InvalidArgumentError, InvalidKeyError
from kvtier.region import HostRegion
from kvtier.tiers.base import SecondaryTier
from kvtier.tiers.fault import FaultInjectingTier
from kvtier.tiers.fs.tier import FilesystemTier
from tests.conftest import config, fill, make_keys, read, settle, store
from tests.core.test_manager_guards import GatedTier

ENGINE_CALLS = ["prepare_store", "complete_store", "lookup", "prepare_load", "complete_load"]
ENGINE_CALLS += ["touch", "promote_for_peer", "prefetch"]


def fs_config(root: str, slots: int = 8) -> TieringConfig:
    return config(slots, secondary_tiers=[{"type": "fs", "root_dir": root}])


@pytest.fixture
def fs_manager(identity, tmp_path) -> Iterator[TieringManager]:
    with TieringManager(fs_config(str(tmp_path / "fs")), identity) as m:
        yield m


def fs_factory(root: str, **faults: object) -> Callable[..., SecondaryTier]:
    """A real fs tier under ``root``, wrapped to inject ``faults`` (a delay, a held job)."""

    def make(region: HostRegion, identity: object) -> SecondaryTier:
        fs = FilesystemTier(FsTierConfig(root_dir=root), region, identity)  # type: ignore[arg-type]
        return FaultInjectingTier(fs, **faults)  # type: ignore[arg-type]

    return make


def untouched(m: TieringManager) -> bool:
    """Nothing reserved, held or written through."""
    host = m.stats()["host"]
    return host["used_slots"] == 0 and host["held_slots"] == 0 and m.num_pending_jobs == 0


# -- keys that are not a sequence of 32-byte ChunkKeys ------------------------------------------
NOT_A_SEQUENCE: dict[str, Callable[[list[ChunkKey]], object]] = {
    "generator": lambda keys: (key for key in keys),
    "iterator": iter,
    "set": set,
    "frozenset": frozenset,
    "dict": dict.fromkeys,
    "dict-keys": lambda keys: dict.fromkeys(keys).keys(),
}


@pytest.mark.parametrize("shape", NOT_A_SEQUENCE, ids=list(NOT_A_SEQUENCE))
@pytest.mark.parametrize("method", ENGINE_CALLS)
def test_keys_that_are_not_a_sequence_are_refused_at_the_call(fs_manager, identity, shape, method):
    """A generator was read by the entry check and reached the method empty; a set or dict
    failed later with a ``TypeError`` from inside (``keys[:n]``)."""
    keys = make_keys(identity, 2)
    with pytest.raises(InvalidKeyError, match="sequence of ChunkKey"):
        getattr(fs_manager, method)(NOT_A_SEQUENCE[shape](keys))
    assert untouched(fs_manager)


def test_a_store_completed_with_a_generator_is_refused_and_can_still_complete(
    fs_manager, identity, tmp_path
):
    """``complete_store(generator)`` completed nothing and said nothing: the slots stayed being
    written for good (never ready, never evictable, never written through)."""
    keys = make_keys(identity, 2)
    plan = fs_manager.prepare_store(keys)
    assert plan is not None
    for key, slot in zip(plan.keys, plan.slots, strict=True):
        fill(fs_manager.region, slot, key)
    with pytest.raises(InvalidKeyError):
        fs_manager.complete_store(key for key in plan.keys)
    assert fs_manager.lookup(keys) == 0, "nothing was completed by the refused call"
    fs_manager.complete_store(plan.keys)
    assert fs_manager.lookup(keys) == 2 and read(fs_manager, keys)
    assert fs_manager.wait_idle(10)
    fs_manager.close()
    with TieringManager(fs_config(str(tmp_path / "fs")), identity) as fresh:
        assert settle(fresh, keys) == 2 and read(fresh, keys)


@pytest.mark.parametrize("raw", [b"", b"abc", bytes(31), bytes(33), bytes(64)], ids=len)
@pytest.mark.parametrize("method", ENGINE_CALLS)
def test_keys_that_are_not_32_bytes_are_refused_at_the_call(fs_manager, identity, raw, method):
    """A short key was kept in host memory and its fs write failed in the tier's thread (an
    empty key named no file at all)."""
    keys = [*make_keys(identity, 1), ChunkKey(raw)]
    with pytest.raises(InvalidKeyError, match="32-byte"):
        getattr(fs_manager, method)(keys)
    assert untouched(fs_manager)


# -- a malformed parent ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "parent",
    ["ab" * 16, b"ab", bytes(31), bytes(33), 7, [bytes(32)]],
    ids=["str", "2-bytes", "31-bytes", "33-bytes", "int", "list"],
)
def test_a_malformed_parent_is_refused_at_the_call_and_reserves_nothing(
    fs_manager, identity, parent
):
    """A str parent failed the whole fs write in the tier's thread (every key of the store,
    counted as a tier failure only); a short one was padded and written as a garbled link."""
    keys = make_keys(identity, 2)
    with pytest.raises(InvalidKeyError, match="parent"):
        fs_manager.prepare_store(keys, first_chunk=1, parent=parent)
    assert untouched(fs_manager)


def test_a_store_with_a_real_parent_is_written_and_linked(fs_manager, identity):
    """The check refuses only malformed parents: a 32-byte one (``ChunkKey`` or ``bytes``)
    goes through, and the fs tier takes the chunks for reachable."""
    head, *tail = make_keys(identity, 3)
    store(fs_manager, [head])
    plan = fs_manager.prepare_store(tail, first_chunk=1, parent=bytes(head))
    assert plan is not None
    for key, slot in zip(plan.keys, plan.slots, strict=True):
        fill(fs_manager.region, slot, key)
    fs_manager.complete_store(plan.keys)
    assert fs_manager.wait_idle(10)
    counters = fs_manager.stats()["counters"]
    assert counters["kvtier_tier_chunks_total{op=store,outcome=ok,tier=fs}"] == 3
    assert fs_manager.tiers[0].stats()["unreachable_chunks"] == 0


# -- timeouts ----------------------------------------------------------------------------------
def test_a_nan_timeout_is_refused_instead_of_waiting_for_ever(identity, tmp_path):
    """With a store job that does not report, ``wait_idle(nan)`` and ``close(timeout=nan)``
    never reached their deadline (no clock is ``>= nan``): the engine hung."""

    def gated_fs(region, identity):
        return GatedTier(FilesystemTier(FsTierConfig(root_dir=str(tmp_path)), region, identity))

    m = TieringManager(config(4), identity, tiers=[gated_fs])
    try:
        store(m, make_keys(identity, 1))
        assert m.num_pending_jobs == 1
        for call in (lambda: m.wait_idle(float("nan")), lambda: m.close(timeout=float("nan"))):
            outcome: list[BaseException | None] = []
            waiter = threading.Thread(target=lambda c=call, o=outcome: o.append(_raised(c)))
            waiter.start()
            waiter.join(5)
            assert not waiter.is_alive(), "a NaN timeout must not wait for ever"
            assert isinstance(outcome[0], InvalidArgumentError)
        assert m.lookup(make_keys(identity, 1)) == 1, "the refused close closed nothing"
    finally:
        m.tiers[0].open()
        m.close()


@pytest.mark.parametrize("bad", ["1", b"1", [1], True, 10**400])
def test_a_timeout_that_is_not_a_number_is_a_kvtier_error(fs_manager, bad):
    """These raised a bare ``TypeError`` (or ``OverflowError``) from the arithmetic inside."""
    for call in (fs_manager.wait_idle, fs_manager.wait_progress, fs_manager.close):
        with pytest.raises(InvalidArgumentError, match="timeout"):
            call(bad)
    assert settle(fs_manager, make_keys(fs_manager.identity, 1)) == 0, "still open"


def _raised(call: Callable[[], object]) -> BaseException | None:
    try:
        call()
    except BaseException as exc:
        return exc
    return None


# -- close from two threads ----------------------------------------------------------------------
def test_a_second_close_from_another_thread_returns_only_once_closed(identity, tmp_path):
    """The second call returned at once while the first still drained a slow fs write, so its
    caller went on (removed the directory, exited) with tier threads running and a job pending.
    """
    before = set(threading.enumerate())
    m = TieringManager(config(4), identity, tiers=[fs_factory(str(tmp_path), delay_s=0.5)])
    keys = make_keys(identity, 2)
    store(m, keys)
    first = threading.Thread(target=m.close)
    first.start()
    while not m._closed:  # the first close has begun
        threading.Event().wait(0.001)
    m.close()
    assert m.num_pending_jobs == 0, "the second close returned before the drain"
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] in (
        [],
        [first],
    )
    first.join(10)
    assert not first.is_alive()
    with TieringManager(fs_config(str(tmp_path)), identity) as fresh:
        assert settle(fresh, keys) == 2 and read(fresh, keys)


class ClosingService:
    """A service whose ``close`` closes the manager again, from the closing thread."""

    def __init__(self, manager: TieringManager) -> None:
        self.manager, self.closed = manager, False

    def step(self, host: object) -> None:
        """Nothing to do."""

    def close(self) -> None:
        self.manager.close()
        self.closed = True


def test_a_close_from_inside_close_does_not_wait_for_itself(fs_manager):
    service = ClosingService(fs_manager)
    fs_manager.add_service(service)
    closer = threading.Thread(target=fs_manager.close)
    closer.start()
    closer.join(10)
    assert not closer.is_alive(), "close waited for itself"
    assert service.closed


# -- the same key twice in one call ----------------------------------------------------------------
def test_a_key_completed_twice_in_one_call_is_stored_and_written_once(fs_manager, identity):
    """``prepare_store`` reserves one slot for a repeated key, but ``complete_store([a, a])``
    counted two stored chunks, made two ``STORED`` events and sent the fs tier a job writing
    the same file twice."""
    a = make_keys(identity, 1)[0]
    plan = fs_manager.prepare_store([a, a])
    assert plan is not None and plan.keys == [a]
    fill(fs_manager.region, plan.slots[0], a)
    fs_manager.complete_store([a, a])
    assert fs_manager.wait_idle(10)
    counters = fs_manager.stats()["counters"]
    assert counters["kvtier_stored_chunks_total"] == 1
    assert counters["kvtier_tier_chunks_total{op=store,outcome=ok,tier=fs}"] == 1
    assert [e.kind.value for e in fs_manager.take_events()] == ["stored", "written"]
    assert fs_manager.stats()["host"]["held_slots"] == 0 and read(fs_manager, [a])
