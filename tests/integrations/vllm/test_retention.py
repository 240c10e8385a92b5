"""Retention and admission under vLLM, the vLLM-free parts: parsing ``kvtier_retention``, the
``PriorityCache`` behind ``KvtierPriorityPolicy`` (checked against a reference model), the
operator's caps and retention (``kv_hints``), and a tier's ``admission``."""

from __future__ import annotations

import math
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config import RuntimeConfig
from kvtier.core.runtime import Runtime
from kvtier.core.tier_set import Retired
from kvtier.errors import ConfigError, InvalidArgumentError
from kvtier.integrations.vllm import engine as engines
from kvtier.integrations.vllm import request_retention as retentions
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
from kvtier.policies import priority as priorities
from kvtier.policies.priority import DEFAULT_PRIORITY


class Context:
    """The parts of vLLM's ``ReqContext`` the adapter reads (the real one in the engine tests)."""

    def __init__(
        self, params: Any, positions: dict[bytes, int] | None = None, hints: Any = None
    ) -> None:
        self.req_id, self.kv_transfer_params, self.kv_hints = "r1", params, hints
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


# -- numbers of any size, the operator's caps and retention (issue 25, finding 6) -------------
HUGE, ENORMOUS = 10**400, 10**5000  # past the floats; past Python's int-to-text limit


def label(value: Any) -> str:
    """A test id for ``value`` (``repr`` fails past 4,300 digits)."""
    try:
        return repr(value)[:40]
    except ValueError:
        return "enormous"


@pytest.mark.parametrize(
    ("entry", "names"),
    [({"priority": 50, "duration_s": HUGE}, "duration_s"),
     ({"priority": 50, "duration_s": -HUGE}, "duration_s"),
     ({"priority": 50, "duration_s": ENORMOUS}, "duration_s"),
     ({"priority": 50, "duration_s": Fraction(HUGE)}, "duration_s"),
     ({"priority": 50, "duration_s": 1e-400}, "duration_s"),
     ({"priority": 50, "duration_s": -math.inf}, "duration_s"),
     ({"priority": HUGE}, "priority"), ({"priority": -ENORMOUS}, "priority"),
     ({"ranges": [{"end": 9, "priority": 5, "duration_s": HUGE}]}, "duration_s"),
     ({"ranges": [{"start": -ENORMOUS, "end": 9, "priority": 5}]}, "start"),
     ({"ranges": [{"start": ENORMOUS, "end": 9, "priority": 5}]}, "end"),
     ({"priority": 5, ENORMOUS: 1}, "unknown key"), ({"priority": 5, 7: 1, "x": 2}, "unknown key")],
    ids=label,
)  # fmt: skip
def test_numbers_of_any_size_are_a_malformed_entry_never_another_error(entry, names):
    """A 400-digit ``duration_s`` raised ``OverflowError`` out of the parser."""
    with pytest.raises(InvalidArgumentError, match=names) as caught:
        parse_retention(given_(entry))
    assert len(str(caught.value)) < 200


@pytest.mark.parametrize("duration", [HUGE, ENORMOUS, Fraction(HUGE)], ids=label)
def test_a_huge_duration_reaches_the_cache_policy_as_an_ignored_entry(duration):
    """It raised ``OverflowError`` out of ``KvtierPriorityPolicy`` (vLLM's scheduler thread)."""
    context = Context(given_({"priority": 90, "duration_s": duration}), {b"a": 128})
    cache = filled([b"a"])
    cache.use([b"a"], retention_by_key(context))
    cache.note_new([b"b"], retention_by_key(context))
    assert is_invalid(context) and cache.priority_of(b"a") == DEFAULT_PRIORITY


@pytest.fixture
def caps():
    """``set_caps(priority, duration_s)`` installs the operator's caps; the defaults after."""
    yield lambda p=90, d=None: retentions.set_limits(priorities.RequestLimits(p, d))
    retentions.set_limits(priorities.RequestLimits())


@pytest.mark.parametrize(
    ("cap", "asked", "given"),
    [(80, 0, 0), (80, 79, 79), (80, 80, 80), (80, 81, 80), (80, 100, 80), (90, 90, 90),
     (90, 91, 90), (100, 100, 100)],
)  # fmt: skip
def test_a_requests_priority_is_cut_to_the_cap_and_flagged(caps, cap, asked, given):
    caps(cap)
    context = Context(given_({"priority": asked, "ranges": [{"end": 128, "priority": asked}]}))
    retention = request_retention(context)
    assert retention is not None and retention.default == Retention(given)
    assert retention.at(64) == Retention(given)
    assert retentions.is_capped(context) is (given != asked)


@pytest.mark.parametrize(
    ("asked", "given"),
    [(None, 600.0), (599.5, 599.5), (600, 600.0), (600.001, 600.0), (1e300, 600.0)],
)
def test_a_requests_duration_is_cut_to_the_cap_and_flagged(caps, asked, given):
    caps(100, 600.0)
    entry = {"priority": 90} if asked is None else {"priority": 90, "duration_s": asked}
    context = Context(given_(entry))
    assert request_retention(context).default == Retention(90, given)  # type: ignore[union-attr]
    assert retentions.is_capped(context) is (given != asked)


def test_by_default_requests_may_ask_up_to_90():
    assert request_retention(Context(given_({"priority": 100}))).default == Retention(90)  # type: ignore[union-attr]


@pytest.mark.parametrize(("now", "evicted"), [(599.999, b"other"), (600.0, b"held")])
def test_a_capped_duration_ends_at_the_cap_and_not_before(caps, now, evicted):
    caps(100, 600.0)
    clock = Clock()
    cache: PriorityCache[str] = PriorityCache(8, "lru", clock)
    forever = Context(given_({"priority": 90}))
    cache.note_new([b"held"], retention_by_key(forever))
    for key in (b"held", b"other"):
        cache.insert(key, "c", evictable=True)
    clock.now = now
    assert [k for k, _ in cache.evict(1, set()) or []] == [evicted]


def hints(entry: Any, *more: Any) -> Any:
    """vLLM's ``KvHintsEnvelope`` with one ``kvtier_retention`` action (and ``more`` actions)."""
    action = SimpleNamespace(action_type="kvtier_retention", payload=entry)
    return SimpleNamespace(protocol_version="1", message_id="m", actions=[action, *more])


def test_the_operators_retention_comes_in_kv_hints_and_is_not_capped(caps):
    caps(80)
    context = Context(given_({"priority": 100}), {b"sys": 128, b"q": 256},
                      hints({"ranges": [{"end": 128, "priority": 95}]}))  # fmt: skip
    retention_of = retention_by_key(context)
    assert retention_of is not None
    assert retention_of(b"sys") == Retention(95, operator=True)
    assert retention_of(b"q") == Retention(80) and retentions.is_capped(context)


@pytest.mark.parametrize(
    "envelope",
    [hints({"priority": HUGE}), hints({"priority": 95}, SimpleNamespace(action_type="kvtier_retention", payload={})),
     hints([95]), hints({"priority": 95, "duration_s": HUGE})],
    ids=["huge", "twice", "not-an-object", "huge-duration"],
)  # fmt: skip
def test_malformed_operator_retention_is_ignored_and_flagged(envelope):
    context = Context(given_({"priority": 60}), hints=envelope)
    assert retentions.is_invalid(context) and retentions.operator_retention(context) is None
    assert request_retention(context) is not None, "the request's own still applies"


def test_other_hints_and_none_leave_retention_alone():
    other = SimpleNamespace(action_type="prefetch", payload={"priority": 99})
    for envelope in (None, SimpleNamespace(actions=[other]), SimpleNamespace(actions=None)):
        context = Context(None, hints=envelope)
        assert retention_by_key(context) is None and not retentions.is_invalid(context)


def flood_round(cache: PriorityCache[str], keys: list[bytes], retention_of: Any) -> None:
    """Store ``keys`` as vLLM's manager does: evict what they need, then insert them."""
    need = len(cache.chunks) + len(keys) - 8
    if need > 0:
        assert cache.evict(need, set()) is not None
    cache.note_new(keys, retention_of)
    for key in keys:
        cache.insert(key, "c", evictable=True)


@pytest.mark.parametrize("operator", [True, False])
def test_one_client_asking_for_100_forever_cannot_evict_the_operators_prefix(caps, operator):
    """The issue's test under vLLM: 8 chunks of host memory, a 2-chunk system prompt the
    operator retains at 95 (``kv_hints``; requests capped at 80), one client storing 6 new
    chunks a round at 100 for good and asking for the prompt at 0. With the operator's
    retention the prompt stays all 50 rounds; asked by a request instead, it is gone."""
    caps(80)
    prompt = [b"sys0", b"sys1"]
    positions = {b"sys0": 128, b"sys1": 256}
    entry = {"ranges": [{"end": 256, "priority": 95}]}
    first = Context(
        None if operator else given_(entry), positions, hints(entry) if operator else None
    )
    cache: PriorityCache[str] = PriorityCache(8, "lru", Clock())
    flood_round(cache, prompt, retention_by_key(first))
    kept = 0
    for round_ in range(50):
        flood = [f"flood-{round_}-{i}".encode() for i in range(6)]
        flood_round(cache, flood, retention_by_key(Context(given_({"priority": 100}))))
        lower = Context(given_({"priority": 0}), positions)
        cache.use([k for k in prompt if k in cache.chunks], retention_by_key(lower))
        kept += all(key in cache.chunks for key in prompt)
    if operator:
        assert kept == 50 and [cache.priority_of(k) for k in prompt] == [95, 95]
    else:
        assert kept == 1, "kept while there was room: the first round"


def test_a_request_cut_to_the_caps_is_counted_once_and_the_caps_come_from_the_config():
    extra = {"max_request_priority": 80, "max_request_duration_s": 600,
             "eviction_policy": "KvtierPriorityPolicy", "cache_policy_module_path": "kvtier.integrations.vllm"}  # fmt: skip
    engine = engines.join(
        SimpleNamespace(config=SimpleNamespace(engine_id="caps"), extra_config=extra), 4096
    )
    try:
        capped = Context(given_({"priority": 81, "duration_s": 60}))
        engine.note_request(capped)
        engine.note_request(capped)  # every tier sees the request: counted once
        within = Context(given_({"priority": 80, "duration_s": 600}))
        within.req_id = "r2"
        engine.note_request(within)
        telemetry = engine.runtime.metrics.telemetry
        assert telemetry.get("kvtier_retention_ignored_total", reason="capped") == 1
        assert request_retention(capped).default == Retention(80, 60.0)  # type: ignore[union-attr]
    finally:
        engines.leave(engine)
    assert retentions.current_limits() == priorities.RequestLimits(), "reset with the last engine"


@pytest.mark.parametrize(
    ("key", "value"),
    [("max_request_priority", 101), ("max_request_priority", -1), ("max_request_priority", HUGE),
     ("max_request_duration_s", 0), ("max_request_duration_s", math.inf), ("max_request_duration_s", HUGE)],
    ids=label,
)  # fmt: skip
def test_a_cap_out_of_range_in_the_extra_config_is_refused_naming_the_key(key, value):
    spec = SimpleNamespace(config=SimpleNamespace(engine_id="bad-caps"), extra_config={key: value})
    with pytest.raises(ConfigError, match=f"kv_connector_extra_config.{key}"):
        engines.join(spec, 4096)
