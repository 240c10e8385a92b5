"""Admission: what host memory and each tier keep; dropped chunks are counted and recomputed.

Scenarios through the manager's API on a real fs tier, and the frequency sketch on its own.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import ChunkKey, ConfigError, TieringManager
from kvtier.control.admission.sketch import FrequencySketch
from tests.conftest import config, fill, make_keys, push_out, read, settle


def fs(root, **extra):
    return {"type": "fs", "root_dir": str(root), **extra}


def dropped(m, tier, reason):
    name = f"kvtier_admission_dropped_total{{reason={reason},tier={tier}}}"
    return m.stats()["counters"].get(name, 0)


def recomputed(m, reason):
    return m.stats()["counters"].get(f"kvtier_recomputed_chunks_total{{reason={reason}}}", 0)


def offer(m, keys, **kwargs):
    """prepare_store + complete_store of whatever the plan admits; the admitted keys."""
    plan = m.prepare_store(keys, **kwargs)
    assert plan is not None
    for key, slot in zip(plan.keys, plan.slots):
        fill(m.region, slot, key)
    m.complete_store(plan.keys)
    return plan.keys


def test_store_threshold_keeps_host_memory_for_chunks_seen_twice(identity):
    keys = make_keys(identity, 3)
    with TieringManager(config(4, store_threshold=2), identity) as m:
        assert offer(m, keys) == []
        assert dropped(m, "host", "min_reuse") == 3
        assert m.lookup(keys) == 0 and recomputed(m, "not_admitted") == 3
        assert offer(m, keys) == keys
        assert m.lookup(keys) == 3 and read(m, keys)


def test_a_tier_admits_only_chunks_seen_twice_and_the_miss_says_not_admitted(identity, tmp_path):
    keys, again = make_keys(identity, 2), make_keys(identity, 2, seed=4)
    admission = [{"level": "fs", "min_reuse": 2}]
    cfg = config(2, secondary_tiers=[fs(tmp_path)], admission=admission)
    with TieringManager(cfg, identity) as m:
        offer(m, keys)  # seen once: host yes, fs no
        assert m.wait_idle(10)
        assert dropped(m, "fs", "min_reuse") == 2
        offer(m, again)
        m.prepare_load(again), m.complete_load(again)  # a second sighting: a use
        push_out(m, identity, 2)
        assert settle(m, keys) == 0 and recomputed(m, "not_admitted") == 2
        offer(m, keys)  # the second offer: written through now
        assert m.wait_idle(10)
        push_out(m, identity, 2, seed=77)
        assert settle(m, keys) == 2 and read(m, keys)
    assert not list(tmp_path.rglob(again[0].hex())), "used once after its store: not written"


@pytest.mark.parametrize("traffic", [0, 40])
def test_the_frequency_filter_forgets_with_its_window(identity, tmp_path, traffic):
    """min_frequency 2, counts halved every 8 sightings: a chunk stored and loaded is written
    to fs when offered again soon, not after 40 sightings of other chunks."""
    key = make_keys(identity, 1)
    admission = [{"level": "fs", "min_frequency": 2, "frequency_window": 8}]
    cfg = config(2, secondary_tiers=[fs(tmp_path)], admission=admission)
    with TieringManager(cfg, identity) as m:
        offer(m, key)
        m.prepare_load(key), m.complete_load(key)
        for seed in range(traffic):
            m.touch(make_keys(identity, 1, seed=100 + seed))
        m.disable_tier("fs")  # make room without writing the other chunks anywhere
        push_out(m, identity, 2)
        m.enable_tier("fs")
        assert offer(m, key) == key
        assert m.wait_idle(10)
    assert bool(list(tmp_path.rglob(key[0].hex()))) is (traffic == 0)


def test_short_prefixes_are_not_persisted(identity, tmp_path):
    keys = make_keys(identity, 4)
    admission = [{"level": "fs", "min_prefix_chunks": 4}]
    cfg = config(8, secondary_tiers=[fs(tmp_path)], admission=admission)
    with TieringManager(cfg, identity) as m:
        offer(m, keys[:2])  # a 2-chunk prefix
        offer(m, keys[2:], first_chunk=2)  # chunks 2 and 3 of a 4-chunk prefix
        assert m.wait_idle(10)
        assert dropped(m, "fs", "min_prefix_chunks") == 2
    assert [bool(list(tmp_path.rglob(k.hex()))) for k in keys] == [False, False, True, True]


@pytest.mark.parametrize(
    ("min_priority", "priorities", "written"),
    [(50, [10, 60], [False, True]),
     (10, [0, 5], [False, False])],  # 0 is a priority, not "none given" (35)
)  # fmt: skip
def test_chunks_below_secondary_min_priority_stay_in_host(
    identity, tmp_path, min_priority, priorities, written
):
    keys = make_keys(identity, 2)
    cfg = config(4, secondary_tiers=[fs(tmp_path)], secondary_min_priority=min_priority)
    with TieringManager(cfg, identity) as m:
        offer(m, keys, priority=priorities)
        assert m.wait_idle(10)
        assert dropped(m, "fs", "priority") == written.count(False)
    assert [bool(list(tmp_path.rglob(k.hex()))) for k in keys] == written


def test_a_prefix_counts_its_chunks_already_in_host(identity):
    """A 4-chunk request whose first 3 chunks are in host stores its 4th: the prefix is 4
    chunks long, however many of them had to be offered."""
    keys = make_keys(identity, 4)
    with TieringManager(config(8, admission=[{"min_prefix_chunks": 3}]), identity) as m:
        assert offer(m, keys[:3]) == keys[:3]
        assert offer(m, keys, first_chunk=0) == keys[3:]
        assert dropped(m, "host", "min_prefix_chunks") == 0


def test_min_prefix_chunks_0_is_accepted_as_documented(identity):
    cfg = config(2, admission=[{"min_reuse": 2, "min_prefix_chunks": 0}])
    assert cfg.admission[0].min_prefix_chunks == 0


def test_a_tier_named_host_is_refused_while_admission_is_configured(identity, tmp_path):
    """``level: host`` means host memory: a tier of that name would take host memory's rules
    and skip secondary_min_priority."""
    tiers = [fs(tmp_path, name="host")]
    with pytest.raises(ConfigError, match="host"):
        TieringManager(config(2, secondary_tiers=tiers, secondary_min_priority=50), identity)
    with TieringManager(config(2, secondary_tiers=tiers), identity) as m:
        assert m.tier_states() == (["host"], [])


def test_a_policy_of_your_own_by_module_path(identity):
    keys = make_keys(identity, 16)
    plugin = {
        "module_path": "tests.plugins.admission_policy",
        "type": "EvenFirstByte",
        "options": {"parity": 1},
    }
    with TieringManager(config(16, admission=[plugin]), identity) as m:
        kept = offer(m, keys)
        assert kept == [k for k in keys if k[0] % 2 == 1]
        assert dropped(m, "host", "odd_byte") == 16 - len(kept)


def test_an_entry_with_a_policy_of_your_own_and_rules_applies_both(identity):
    """One entry with module_path and min_reuse 2: its min_reuse was silently ignored."""
    keys = make_keys(identity, 16)
    entry = {
        "module_path": "tests.plugins.admission_policy",
        "type": "EvenFirstByte",
        "options": {"parity": 1},
        "min_reuse": 2,
    }
    with TieringManager(config(16, admission=[entry]), identity) as m:
        assert offer(m, keys) == []
        assert dropped(m, "host", "min_reuse") == 16
        assert offer(m, keys) == [k for k in keys if k[0] % 2 == 1]
        assert dropped(m, "host", "odd_byte") == 16 - len([k for k in keys if k[0] % 2 == 1])


@pytest.mark.parametrize("mode", ["raise", "short", "bad"])
def test_a_broken_policy_drops_its_offers_and_never_fails_the_engine(identity, tmp_path, mode):
    """Host memory's policy and the fs tier's both broken: every chunk is recomputed, counted
    as the policy's error, and the manager keeps serving (no hold or write left behind)."""
    keys = make_keys(identity, 4)
    broken = {
        "module_path": "tests.plugins.admission_policy",
        "type": "Broken",
        "options": {"mode": mode},
    }
    cfg = config(4, secondary_tiers=[fs(tmp_path)], admission=[broken, broken | {"level": "fs"}])
    with TieringManager(cfg, identity) as m:
        assert offer(m, keys) == []
        assert dropped(m, "host", "policy_error") == 4
        assert settle(m, keys) == 0 and recomputed(m, "not_admitted") == 4
        assert m.stats()["host"]["held_slots"] == 0
    cfg = config(4, secondary_tiers=[fs(tmp_path)], admission=[broken | {"level": "fs"}])
    with TieringManager(cfg, identity) as m:
        assert offer(m, keys) == keys  # host memory keeps them; the fs tier gets none
        assert m.wait_idle(10) and dropped(m, "fs", "policy_error") == 4
        assert m.lookup(keys) == 4 and read(m, keys)
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and len(p.name) == 64]


@pytest.mark.parametrize(
    ("admission", "match"),
    [([{"level": "nope"}], r"admission\[0\]\.level"),
     ([{"module_path": "tests.plugins.admission_policy", "type": "Missing"}], "Missing"),
     ([{"module_path": ".admission_policy", "type": "Broken"}], r"module_path: expected a dotted"),
     ([{"module_path": "tests.plugins.broken_at_import", "type": "X"}], r"module_path.*a bug"),
     ([{"module_path": "tests.plugins.admission_policy", "type": "EvenFirstByte",
        "options": {"bogus": 1}}], "options")],
)  # fmt: skip
def test_bad_admission_settings_name_the_key(identity, admission, match):
    with pytest.raises(ConfigError, match=match):
        TieringManager(config(2, admission=admission), identity)


def test_without_admission_everything_is_kept(identity, tmp_path):
    keys = make_keys(identity, 2)
    with TieringManager(config(2, secondary_tiers=[fs(tmp_path)]), identity) as m:
        assert offer(m, keys) == keys
        assert m.wait_idle(10)
    assert all(list(tmp_path.rglob(k.hex())) for k in keys)


# -- the sketch -------------------------------------------------------------------------------
@settings(max_examples=30)
@given(st.lists(st.integers(0, 40), max_size=300))
def test_the_sketch_never_counts_below_the_truth_without_decay(sightings):
    """Small width (collisions on purpose), one sighting per call: estimates >= true counts."""
    keys = [ChunkKey(np.random.default_rng(i).bytes(32)) for i in range(41)]
    sketch = FrequencySketch(width=16, decay_every=1 << 30)
    for i in sightings:
        sketch.record([keys[i]])
    truth = np.bincount(np.array(sightings, dtype=int), minlength=41)
    assert (sketch.estimate(keys) >= np.minimum(truth, 255)).all()


def test_the_sketch_has_a_fixed_size_whatever_it_sees():
    sketch = FrequencySketch(width=1 << 10)
    size = sketch._counts.nbytes
    for _ in range(20):
        sketch.record([ChunkKey(os.urandom(32)) for _ in range(512)])
    assert sketch._counts.nbytes == size == 4 << 10
    assert sketch.estimate([ChunkKey(os.urandom(32))])[0] <= 255


def test_counts_are_halved_once_per_window_even_within_one_call():
    """frequency_window 8: a key seen 6 times, then 18 sightings of other keys in one call
    (3 windows' worth): halved 3 times, as 18 separate sightings would have."""
    key = ChunkKey(bytes(range(32)))
    others = [ChunkKey(np.random.default_rng(i).bytes(32)) for i in range(18)]
    burst, steady = FrequencySketch(decay_every=8), FrequencySketch(decay_every=8)
    for sketch in (burst, steady):
        for _ in range(6):
            sketch.record([key])
    burst.record(others)
    for other in others:
        steady.record([other])
    assert burst.estimate([key])[0] == steady.estimate([key])[0] == 0
