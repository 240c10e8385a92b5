"""Retention and admission under vLLM, the vLLM-free parts: parsing ``kvtier_retention``, the
``PriorityCache`` behind ``KvtierPriorityPolicy`` (checked against a reference model), and a
tier's ``admission``."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config import RuntimeConfig
from kvtier.core.runtime import Runtime
from kvtier.core.tier_set import Retired
from kvtier.errors import ConfigError, InvalidArgumentError
from kvtier.integrations.vllm.options import admission_config
from kvtier.integrations.vllm.priority_cache import PriorityCache
from kvtier.integrations.vllm.request_retention import (
    RETENTION_KEY,
    Retention,
    is_invalid,
    parse_retention,
    request_retention,
    retention_by_key,
)
from kvtier.policies.priority import DEFAULT_PRIORITY


class Context:
    """The parts of vLLM's ``ReqContext`` the adapter reads (the real one in the engine tests)."""

    def __init__(self, params: Any, positions: dict[bytes, int] | None = None) -> None:
        self.req_id, self.kv_transfer_params = "r1", params
        self._state: dict[type, Any] = {}
        self._positions = positions or {}

    def get_state(self, cls: type) -> Any:
        return self._state.get(cls)

    def set_state(self, value: Any) -> None:
        self._state[type(value)] = value

    def get_offload_key_position(self, key: bytes) -> int | None:
        return self._positions.get(key)


def given_(entry: Any) -> dict[str, Any]:
    return {RETENTION_KEY: entry}


# -- parsing --------------------------------------------------------------------------------
def test_absent_retention_is_none_and_a_full_entry_parses():
    assert parse_retention(None) is None
    assert parse_retention({"kv_load_tiers": []}) is None
    asked = parse_retention(
        given_({"priority": 80, "duration_s": 60, "ranges": [{"end": 256, "priority": 95}]})
    )
    assert asked is not None
    assert asked.default == Retention(80, 60.0)
    assert asked.at(128) == asked.at(256) == Retention(95, None)
    assert asked.at(384) == asked.at(None) == Retention(80, 60.0)


def test_a_range_covers_the_chunks_whose_last_token_lies_in_it():
    asked = parse_retention(given_({"ranges": [{"start": 128, "end": 384, "priority": 0}]}))
    assert asked is not None and asked.default is None
    assert [asked.at(end) for end in (128, 256, 384, 512)] == [
        None,
        Retention(0),
        Retention(0),
        None,
    ]


@pytest.mark.parametrize(
    ("entry", "names"),
    [
        (80, RETENTION_KEY),
        ({"priority": 101}, "priority"),
        ({"priority": -1}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": 50.0}, "priority"),
        ({"priority": 50, "duration_s": math.nan}, "duration_s"),
        ({"priority": 50, "duration_s": math.inf}, "duration_s"),
        ({"priority": 50, "duration_s": 0}, "duration_s"),
        ({"duration_s": 10}, "duration_s"),
        ({"priority": 50, "retain": 1}, "retain"),
        ({"ranges": {"end": 5}}, "ranges"),
        ({"ranges": [{"end": 9, "priority": 5}] * 65}, "ranges"),
        ({"ranges": [{"priority": 5}]}, "end"),
        ({"ranges": [{"start": 9, "end": 9, "priority": 5}]}, "end"),
        ({"ranges": [{"start": -1, "end": 9, "priority": 5}]}, "start"),
        ({"ranges": [{"end": 9}]}, "priority"),
    ],
)
def test_a_malformed_entry_is_refused_naming_the_key(entry, names):
    with pytest.raises(InvalidArgumentError, match=names):
        parse_retention(given_(entry))


def test_a_request_with_a_malformed_entry_is_served_without_retention_and_flagged():
    context = Context(given_({"priority": 500}))
    assert request_retention(context) is None and retention_by_key(context) is None
    assert is_invalid(context)
    fine = Context(given_({"priority": 50}))
    assert request_retention(fine) is not None and not is_invalid(fine)
    assert not is_invalid(Context(None))


def test_per_key_retention_uses_vllms_recorded_positions():
    context = Context(
        given_({"priority": 60, "ranges": [{"end": 128, "priority": 90}]}),
        {b"head": 128, b"tail": 256},
    )
    retention_of = retention_by_key(context)
    assert retention_of is not None
    assert retention_of(b"head") == Retention(90) and retention_of(b"tail") == Retention(60)
    assert retention_of(b"unknown") == Retention(60)


# -- the cache behind KvtierPriorityPolicy --------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def filled(keys: list[bytes], priority: int | None = None) -> PriorityCache[str]:
    cache: PriorityCache[str] = PriorityCache(16, "lru", Clock())
    for key in keys:
        cache.note_new([key], None if priority is None else (lambda k: Retention(priority)))
        cache.insert(key, f"chunk-{key.decode()}", evictable=True)
    return cache


def test_without_priorities_it_is_lru_with_the_head_of_a_use_most_recent():
    cache = filled([b"a", b"b", b"c", b"d"])
    cache.use([b"a", b"b"], None)  # a prefix: b touched first, a last
    assert cache.evict(2, set()) == [(b"c", "chunk-c"), (b"d", "chunk-d")]
    assert cache.evict(1, set()) == [(b"b", "chunk-b")]


def test_lower_priorities_go_first_and_pinned_or_protected_chunks_never():
    cache = filled([b"hi"], priority=90)
    for key in (b"x", b"y", b"z"):
        cache.note_new([key], lambda k: Retention(10))
        cache.insert(key, "c", evictable=key != b"y")  # y: its store is still in flight
    assert [k for k, _ in cache.evict(1, {b"x"}) or []] == [b"z"]
    assert cache.evict(3, set()) is None  # only x and hi are evictable: nothing changes
    assert [k for k, _ in cache.evict(2, set()) or []] == [b"x", b"hi"]
    cache.mark(b"y", evictable=True)
    assert [k for k, _ in cache.evict(1, set()) or []] == [b"y"]


def test_an_expired_priority_drops_to_the_default_as_the_least_recently_used():
    clock = Clock()
    cache: PriorityCache[str] = PriorityCache(16, "lru", clock)
    cache.note_new([b"long"], lambda k: Retention(90, duration_s=10))
    cache.insert(b"long", "c", evictable=True)
    for key in (b"p", b"q"):
        cache.insert(key, "c", evictable=True)
    assert [k for k, _ in cache.evict(1, set()) or []] == [b"p"]
    clock.now = 11
    assert cache.priority_of(b"long") == 90  # expiry is applied when an eviction needs it
    assert [k for k, _ in cache.evict(1, set()) or []] == [b"long"]


def test_a_use_with_retention_raises_and_one_without_keeps_the_priority():
    cache = filled([b"a", b"b"])
    cache.use([b"a"], lambda k: Retention(70))
    cache.use([b"a"], None)
    assert cache.priority_of(b"a") == 70 and cache.priority_of(b"b") == DEFAULT_PRIORITY
    assert [k for k, _ in cache.evict(1, set()) or []] == [b"b"]


def test_arc_within_a_priority_and_fresh_chunks_not_counted_as_a_second_use():
    cache: PriorityCache[str] = PriorityCache(4, "arc", Clock())
    for key in (b"a", b"b"):
        cache.insert(key, "c", evictable=True)
    cache.use([b"a", b"b"], None, fresh={b"a", b"b"})  # their own insertion: still once-used
    cache.use([b"b"], None)  # b reused: frequent
    cache.use([b"a"], lambda k: Retention(90), fresh={b"a"})
    assert [k for k, _ in cache.evict(1, set()) or []] == [b"b"]  # priority beats frequency


def test_pending_retentions_do_not_outlive_the_store_they_came_with():
    cache = filled([])
    cache.note_new([b"lost"], lambda k: Retention(90))  # that store's allocation failed
    cache.note_new([b"other"], None)
    cache.insert(b"lost", "c", evictable=True)
    assert cache.priority_of(b"lost") == DEFAULT_PRIORITY


def test_clear_forgets_everything():
    cache = filled([b"a"], priority=90)
    cache.clear()
    assert cache.chunks == {} and cache.evict(1, set()) is None


# -- against a reference model --------------------------------------------------------------
KEYS = st.sampled_from([bytes([i]) for i in range(8)])
LEVEL = st.one_of(st.none(), st.sampled_from([0, DEFAULT_PRIORITY, 60, 100]))
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), KEYS, LEVEL, st.booleans()),
        st.tuples(st.just("use"), st.lists(KEYS, max_size=4, unique=True), LEVEL),
        st.tuples(st.just("mark"), KEYS, st.booleans()),
        st.tuples(st.just("remove"), KEYS),
        st.tuples(st.just("evict"), st.integers(0, 4), st.frozensets(KEYS, max_size=3)),
    ),
    max_size=50,
)


class Reference:
    """Resident keys by (priority, last use); eviction takes evictable, unprotected ones."""

    def __init__(self) -> None:
        self.priority: dict[bytes, int] = {}
        self.used: dict[bytes, int] = {}
        self.evictable: set[bytes] = set()
        self.tick = 0

    def stamp(self, key: bytes) -> None:
        self.tick += 1
        self.used[key] = self.tick

    def evict(self, n: int, protected: frozenset[bytes]) -> list[bytes] | None:
        free = [k for k in self.priority if k in self.evictable and k not in protected]
        if len(free) < n:
            return None
        victims = sorted(free, key=lambda k: (self.priority[k], self.used[k]))[:n]
        for key in victims:
            del self.priority[key], self.used[key]
            self.evictable.discard(key)
        return victims


def apply(cache: PriorityCache[str], ref: Reference, op: tuple[Any, ...]) -> None:
    name, *args = op
    if name == "insert" and args[0] not in ref.priority:
        key, level, evictable = args
        cache.note_new([key], None if level is None else (lambda k: Retention(level)))
        cache.insert(key, "c", evictable)
        ref.priority[key] = DEFAULT_PRIORITY if level is None else level
        ref.stamp(key)
        (ref.evictable.add if evictable else ref.evictable.discard)(key)
    elif name == "use":
        keys, level = args
        cache.use(keys, None if level is None else (lambda k: Retention(level)))
        for key in reversed([k for k in keys if k in ref.priority]):
            ref.priority[key] = ref.priority[key] if level is None else level
            ref.stamp(key)
    elif name == "mark" and args[0] in ref.priority:
        cache.mark(args[0], args[1])
        (ref.evictable.add if args[1] else ref.evictable.discard)(args[0])
    elif name == "remove" and args[0] in ref.priority:
        cache.remove(args[0])
        del ref.priority[args[0]], ref.used[args[0]]
        ref.evictable.discard(args[0])
    elif name == "evict":
        got = cache.evict(args[0], set(args[1]))
        assert (None if got is None else [k for k, _ in got]) == ref.evict(*args)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_the_cache_evicts_as_the_reference_model(ops):
    cache: PriorityCache[str] = PriorityCache(8, "lru", Clock())
    ref = Reference()
    for op in ops:
        apply(cache, ref, op)
    assert set(cache.chunks) == set(ref.priority)


# -- a tier's admission under vLLM ----------------------------------------------------------
def chunk_keys_of(*names: str) -> list[bytes]:
    return [name.encode().ljust(32, b"-") for name in names]


def test_a_tiers_admission_entry_is_checked_naming_the_key():
    assert admission_config(None, "KvtierFs") is None
    assert admission_config({"min_reuse": 2}, "KvtierFs") is not None
    for entry, key in (
        ({"min_reuse": 0}, "min_reuse"),
        ({"level": "host"}, "level"),
        ({"min_prefix_chunks": -1}, "min_prefix_chunks"),
        ({"module_path": "x"}, "module_path"),
        ([2], "expected an object"),
    ):
        with pytest.raises(ConfigError, match=rf"^KvtierFs\.admission.*{key}"):
            admission_config(entry, "KvtierFs")


class TierGate:
    """The engine runtime's admission for one vLLM tier named KvtierFs, as the adapter uses it."""

    def __init__(self, entry: Any, min_priority: int | None = None) -> None:
        self.runtime = Runtime(RuntimeConfig(), 4096)
        config = admission_config(entry, "KvtierFs")
        self.runtime.add_tier(Retired("KvtierFs"), config, min_priority)
        self.runtime.bind()

    def reasons(self, keys: list[bytes], priorities: list[int], prefix: int) -> list[str | None]:
        """Per key: None if admitted, else a reason counted for the offer (the gate counts
        reasons per offer, so keys dropped for different reasons may come out in any order)."""
        from kvtier.keys import ChunkKey

        chunks = [ChunkKey(k) for k in keys]
        before = self.dropped()
        self.runtime.note_offer(chunks)
        offer = self.runtime.admission.offer(chunks, prefix, priorities)
        kept = set(self.runtime.admission.admit("KvtierFs", offer))
        grown = {r: n - before.get(r, 0) for r, n in self.dropped().items() if n > before.get(r, 0)}
        out: list[str | None] = []
        for key in chunks:
            reason = next((r for r, n in grown.items() if n), None) if key not in kept else None
            if reason is not None:
                grown[reason] -= 1
            out.append(reason)
        return out

    def dropped(self) -> dict[str, int]:
        series = self.runtime.metrics.telemetry.snapshot()["kvtier_admission_dropped_total"]
        return {dict(labels)["reason"]: int(n) for labels, n in series.items()}


def test_min_reuse_keeps_a_chunk_from_its_second_offer_and_priority_comes_first():
    gate = TierGate({"min_reuse": 2}, min_priority=50)
    keys = chunk_keys_of("a", "b")
    assert gate.reasons(keys, [60, 60], 2) == ["min_reuse", "min_reuse"]
    assert gate.reasons(keys, [60, 10], 2) == [None, "priority"]


def test_one_store_offered_to_several_tiers_in_a_row_is_one_sighting():
    from kvtier.keys import ChunkKey

    gate = TierGate({"min_reuse": 2})
    chunks = [ChunkKey(k) for k in chunk_keys_of("a")]
    for _ in range(3):  # one store cascaded to three tiers
        gate.runtime.note_offer(chunks, offer_id="store-1")
    offer = gate.runtime.admission.offer(chunks, 1, [35])
    assert gate.runtime.admission.admit("KvtierFs", offer) == []
    gate.runtime.note_offer(chunks, offer_id="store-2")  # stored again, later
    offer = gate.runtime.admission.offer(chunks, 1, [35])
    assert gate.runtime.admission.admit("KvtierFs", offer) == chunks


def test_short_prefixes_are_dropped_and_no_entry_admits_everything():
    gate = TierGate({"min_prefix_chunks": 4})
    keys = chunk_keys_of("a", "b")
    assert gate.reasons(keys, [35, 35], 3) == ["min_prefix_chunks"] * 2
    assert gate.reasons(keys, [35, 35], 4) == [None, None]
    open_gate = TierGate(None)
    assert not open_gate.runtime.admission.active
    assert open_gate.reasons(keys, [0, 0], 1) == [None, None]


def test_a_tiers_own_floor_overrides_the_engines_and_none_takes_it():
    engine_wide = Runtime(RuntimeConfig(secondary_min_priority=40), 4096)
    engine_wide.add_tier(Retired("a"))
    engine_wide.add_tier(Retired("b"), None, 0)
    engine_wide.bind()
    from kvtier.keys import ChunkKey

    chunks = [ChunkKey(k) for k in chunk_keys_of("x", "y")]
    offer = engine_wide.admission.offer(chunks, 2, [39, 40])
    assert engine_wide.admission.admit("a", offer) == [chunks[1]]
    assert engine_wide.admission.admit("b", offer) == chunks


class EvenOnly:
    """A policy of one's own: keeps the keys at even positions of an offer."""

    def admit(self, offer: Any) -> list[str | None]:
        return [None if i % 2 == 0 else "odd" for i in range(len(offer.keys))]


def test_a_policy_of_ones_own_is_loaded_by_module_path_and_its_rules_still_apply():
    entry = {"module_path": __name__, "type": "EvenOnly"}
    gate = TierGate(entry)
    assert gate.reasons(chunk_keys_of("a", "b", "c"), [35] * 3, 3) == [None, "odd", None]
    strict = TierGate({**entry, "min_prefix_chunks": 4})  # dropped before a110506 reached vLLM
    assert strict.reasons(chunk_keys_of("a", "b"), [35] * 2, 3) == ["min_prefix_chunks"] * 2


@pytest.mark.parametrize("mode", ["raise", "short", "bad"])
def test_a_broken_policy_drops_the_offer_instead_of_failing_vllms_scheduler(mode):
    entry = {
        "module_path": "tests.plugins.admission_policy",
        "type": "Broken",
        "options": {"mode": mode},
    }
    gate = TierGate(entry, min_priority=50)
    assert sorted(map(str, gate.reasons(chunk_keys_of("a", "b"), [35, 90], 2))) == [
        "policy_error",
        "priority",
    ]


def test_a_removed_key_inserted_again_keeps_its_new_evictability():
    cache: PriorityCache[str] = PriorityCache(8, "lru", Clock())
    cache.insert(b"a", "c", evictable=True)
    cache.remove(b"a")
    cache.insert(b"a", "c", evictable=False)  # a transfer is in flight for the new chunk
    assert cache.evict(1, set()) is None
