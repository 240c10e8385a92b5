"""Every number of the admission rules, on both sides and at itself, through the manager.

``min_reuse``, ``min_frequency``, ``min_prefix_chunks`` and ``secondary_min_priority`` keep a
chunk that reaches them exactly and drop one a sighting (a chunk, a priority) short;
``frequency_window`` halves the counts at its W-th sighting, not one before or after. The same
rules through the vLLM adapter's gate: ``tests/integrations/vllm/test_retention_bounds.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvtier import ChunkKey, ConfigError, TieringConfig, TieringManager
from kvtier.control.admission import AdmissionConfig
from kvtier.control.admission.sketch import FrequencySketch
from tests.conftest import config, fill, make_keys


def offer(m: TieringManager, keys: list[ChunkKey], **kwargs: object) -> list[ChunkKey]:
    """prepare_store + complete_store of whatever host memory admits; the admitted keys."""
    plan = m.prepare_store(keys, **kwargs)
    assert plan is not None
    for key, slot in zip(plan.keys, plan.slots):
        fill(m.region, slot, key)
    m.complete_store(plan.keys)
    return plan.keys


def fs(root) -> dict[str, object]:
    return {"type": "fs", "root_dir": str(root)}


@pytest.mark.parametrize("threshold", [1, 2, 3])
def test_min_reuse_keeps_a_chunk_from_exactly_its_nth_sighting(identity, threshold):
    key = make_keys(identity, 1)
    with TieringManager(config(4, admission=[{"min_reuse": threshold}]), identity) as m:
        for _ in range(threshold - 1):
            assert offer(m, key) == [], "one sighting short"
        assert offer(m, key) == key, "exactly min_reuse sightings"


@pytest.mark.parametrize("threshold", [2, 3, 5])
def test_min_frequency_keeps_a_chunk_seen_exactly_that_often(identity, threshold):
    key = make_keys(identity, 1)
    entry = {"min_frequency": threshold, "frequency_window": 1000}
    with TieringManager(config(4, admission=[entry]), identity) as m:
        for _ in range(threshold - 1):
            assert offer(m, key) == [], "one sighting short"
        assert offer(m, key) == key, "exactly min_frequency sightings"


@pytest.mark.parametrize("length", [1, 3, 4])
def test_min_prefix_chunks_keeps_a_prefix_exactly_that_long(identity, length):
    keys = make_keys(identity, length + 1)
    with TieringManager(config(8, admission=[{"min_prefix_chunks": length}]), identity) as m:
        assert offer(m, keys[: length - 1]) == [], "one chunk short"
        assert offer(m, keys[:length]) == keys[:length], "exactly min_prefix_chunks"
        assert offer(m, keys) == keys[length:], "one chunk more"


@pytest.mark.parametrize("floor", [1, 50, 90])
def test_secondary_min_priority_keeps_a_chunk_exactly_at_the_floor(identity, tmp_path, floor):
    keys = make_keys(identity, 3)
    cfg = config(4, secondary_tiers=[fs(tmp_path)], secondary_min_priority=floor)
    with TieringManager(cfg, identity) as m:
        offer(m, keys, priority=[floor - 1, floor, floor + 1])
        assert m.wait_idle(10)
        dropped = m.stats()["counters"].get(
            "kvtier_admission_dropped_total{reason=priority,tier=fs}", 0
        )
    written = [bool(list(tmp_path.rglob(key.hex()))) for key in keys]
    assert (written, dropped) == ([False, True, True], 1)


@pytest.mark.parametrize(("others", "kept"), [(0, True), (5, True), (6, False)])
def test_the_frequency_window_halves_counts_at_its_length_and_not_before(identity, others, kept):
    """min_frequency 2, frequency_window 8: a chunk seen once, then ``others`` sightings of
    other chunks, then offered. Its offer is sighting ``others + 2``: the 8th halves its
    count of 2 back to 1 (dropped); the 7th does not (kept)."""
    key = make_keys(identity, 1)
    entry = {"min_frequency": 2, "frequency_window": 8}
    with TieringManager(config(4, admission=[entry]), identity) as m:
        m.touch(key)
        for seed in range(others):
            m.touch(make_keys(identity, 1, seed=100 + seed))
        assert (offer(m, key) == key) is kept


def test_sketch_counters_saturate_instead_of_wrapping():
    key, other = ChunkKey(bytes(range(32))), ChunkKey(bytes(range(1, 33)))
    sketch = FrequencySketch(width=16, decay_every=1 << 30)
    for n in range(1, 301):
        sketch.record([key])
        assert sketch.estimate([key])[0] == min(n, 255)
    assert sketch.estimate([other])[0] <= 255


def test_the_sketch_halves_at_exactly_decay_every_sightings():
    key = ChunkKey(np.random.default_rng(1).bytes(32))
    others = [ChunkKey(np.random.default_rng(i).bytes(32)) for i in range(2, 12)]
    sketch = FrequencySketch(decay_every=4)
    sketch.record([key])
    sketch.record([key])
    sketch.record([others[0]])
    assert sketch.estimate([key])[0] == 2  # 3 sightings: not yet
    sketch.record([others[1]])
    assert sketch.estimate([key])[0] == 1  # the 4th halves


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("module_path", "no such", "dotted module name"),
        ("module_path", ".relative", "dotted module name"),
        ("module_path", "a..b", "dotted module name"),
        ("type", "Two Words", "class name"),
        ("type", "a.B", "class name"),
    ],
)
def test_a_policy_of_your_own_is_named_in_python_when_read_not_when_started(key, value, expected):
    """Read from JSON or built by hand, a name no import could take is refused at once (before
    it was only found when the manager started); names that are Python names pass."""
    entry = {"level": "host", "module_path": "my_policies.keep", "type": "KeepAll", key: value}
    with pytest.raises(ConfigError, match=rf"admission\[0\]\.{key}: expected a {expected}"):
        TieringConfig.from_dict({"cpu_bytes_to_use": 1 << 24, "admission": [entry]})
    with pytest.raises(ConfigError, match=rf"{key}: expected a {expected}"):
        AdmissionConfig(**entry)
    entry[key] = {"module_path": "my_policies.keep", "type": "KeepAll"}[key]
    assert AdmissionConfig(**entry).type == "KeepAll"
