"""An outsider's sweep of the public API: wrong types and values where kvtier promises its own
error at the call (``ConfigError`` naming the key, ``InvalidKeyError``, ``InvalidArgumentError``).

Each test is a misuse that once went wrong: configurations built in Python whose nested objects,
lists and plain strings were not checked at all (a dict for ``deadlines``, a string for
``secondary_tiers``, ``ObjTierConfig(prefix=5)`` raising ``AttributeError``); a truthy
``success="false"`` that made slots the engine never filled ready (and written through);
float token ids cut to integers, so that two prompts shared keys; and layouts, identities and
manager arguments of the wrong type that failed deep inside as ``AttributeError`` or
``TypeError``, or were taken (a sliding window of ``nan`` tokens).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvtier import (
    CacheIdentity,
    ChunkKey,
    ConfigError,
    KVLayout,
    TieringConfig,
    TieringManager,
    chunk_keys,
)
from kvtier.config.schema import RuntimeConfig
from kvtier.control.admission import AdmissionConfig
from kvtier.errors import InvalidArgumentError, InvalidKeyError
from kvtier.layout import LayerGroup
from kvtier.region import HostRegion
from kvtier.tiers.fault import FaultTierConfig
from kvtier.tiers.memory import MemoryTier, MemoryTierConfig
from kvtier.tiers.peer.config import P2PTierConfig
from kvtier.tiers.s3.config import ObjTierConfig
from tests.conftest import SMALL_LAYOUT, config, make_keys, settle

TOP = {"cpu_bytes_to_use": 1 << 20}

# -- configurations built in Python ---------------------------------------------------------
#: (key, value): a value of the wrong type for a key whose type is a nested object, a list or a
#: plain string, which ``TieringConfig(...)`` once took as given.
WRONG_TOP: list[tuple[str, object]] = [
    ("secondary_tiers", 5),
    ("secondary_tiers", "fs"),
    ("secondary_tiers", [{"type": "fs", "root_dir": "/tmp/kv"}]),
    ("deadlines", {"promotion_s": 1.0}),
    ("deadlines", None),
    ("slo_guard", {"ttft_p99_s": 1.0}),
    ("serve", {"port": 5000}),
    ("kv_events", {}),
    ("admission", [{"level": "host"}]),
    ("admission", "host"),
    ("spec_name", 5),
    ("kv_role", ["kv_both"]),
]


@pytest.mark.parametrize(("key", "value"), WRONG_TOP, ids=[f"{k}={v!r}" for k, v in WRONG_TOP])
def test_a_config_built_in_python_refuses_a_nested_value_of_the_wrong_type(key, value):
    with pytest.raises(ConfigError, match=rf"^{key}\b"):
        TieringConfig(**TOP, **{key: value})  # type: ignore[arg-type]


#: (config class, its required keys, key, wrong value) for the configs of tiers and policies.
WRONG_NESTED: list[tuple[type[Any], dict[str, Any], str, object]] = [
    (ObjTierConfig, {"bucket": "b"}, "bucket", 5),
    (ObjTierConfig, {"bucket": "b"}, "prefix", 5),
    (ObjTierConfig, {"bucket": "b"}, "prefix", None),
    (ObjTierConfig, {"bucket": "b"}, "region", ["us-east-1"]),
    (AdmissionConfig, {}, "level", None),
    (AdmissionConfig, {}, "level", 1.5),
    (FaultTierConfig, {"inner": MemoryTierConfig()}, "inner", "memory"),
    (FaultTierConfig, {"inner": MemoryTierConfig()}, "inner", {"type": "memory"}),
    (FaultTierConfig, {"inner": MemoryTierConfig()}, "fail_keys", "00" * 32),
    (P2PTierConfig, {}, "peers", [("127.0.0.1", 5000)]),
]


@pytest.mark.parametrize(
    ("cls", "required", "key", "value"),
    WRONG_NESTED,
    ids=[f"{c.__name__}.{k}={v!r}" for c, _, k, v in WRONG_NESTED],
)
def test_a_tier_or_policy_config_built_in_python_refuses_a_value_of_the_wrong_type(
    cls, required, key, value
):
    with pytest.raises(ConfigError, match=rf"^{key}\b"):
        cls(**{**required, key: value})


def test_a_config_built_in_python_takes_tier_entries_and_nested_configs_of_the_right_type():
    built = TieringConfig(
        **TOP,
        secondary_tiers=[MemoryTierConfig(), FaultTierConfig(inner=MemoryTierConfig())],
        admission=(AdmissionConfig(level="host", min_reuse=2),),
    )
    assert [t.type_name for t in built.secondary_tiers] == ["memory", "fault"]
    assert built.admission[0].min_reuse == 2


def test_metrics_admin_with_a_metrics_host_that_is_no_string_names_the_host():
    with pytest.raises(ConfigError, match=r"^metrics_host"):
        RuntimeConfig(metrics_port=9000, metrics_admin=True, metrics_host=5)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["python", "json"])
def test_an_empty_obj_prefix_is_the_bucket_root_in_python_and_in_json(how):
    """``kvtier cache`` builds ``prefix=""`` for ``s3://bucket``; a file may say the same."""
    if how == "python":
        assert ObjTierConfig(bucket="b", prefix="").prefix == ""
    else:
        entry = {"type": "obj", "bucket": "b", "prefix": ""}
        loaded = TieringConfig.from_dict({**TOP, "secondary_tiers": [entry]})
        assert loaded.secondary_tiers[0].prefix == ""  # type: ignore[attr-defined]


# -- flags of the engine calls --------------------------------------------------------------
@pytest.fixture
def fs_manager(identity, tmp_path):
    fs = {"type": "fs", "root_dir": str(tmp_path / "fs")}
    with TieringManager(config(8, secondary_tiers=[fs]), identity) as m:
        yield m


@pytest.mark.parametrize("success", ["false", "no", 0, 1, None])
def test_complete_store_with_a_success_that_is_not_a_bool_serves_nothing(
    fs_manager, identity, success
):
    """A truthy ``"false"`` once made the unfilled slots ready and wrote them to the fs tier."""
    keys = make_keys(identity, 2)
    plan = fs_manager.prepare_store(keys)
    assert plan is not None
    with pytest.raises(InvalidArgumentError, match="success"):
        fs_manager.complete_store(plan.keys, success=success)
    assert fs_manager.lookup(keys) == 0
    assert fs_manager.num_pending_jobs == 0
    fs_manager.complete_store(plan.keys, success=False)  # the reservation is still the engine's
    assert fs_manager.stats()["host"]["used_slots"] == 0


@pytest.mark.parametrize(
    ("method", "flags"),
    [("touch", {"hit": "no"}), ("touch", {"operator": "no"}), ("prepare_store", {"operator": 1})],
)
def test_a_flag_that_is_not_a_bool_is_refused_at_the_call(fs_manager, identity, method, flags):
    keys = make_keys(identity, 2)
    with pytest.raises(InvalidArgumentError, match=next(iter(flags))):
        getattr(fs_manager, method)(keys, **flags)
    assert fs_manager.stats()["host"]["used_slots"] == 0


def test_numpy_bools_are_flags_too(fs_manager, identity):
    keys = make_keys(identity, 1)
    plan = fs_manager.prepare_store(keys)
    assert plan is not None
    fs_manager.complete_store(plan.keys, success=np.bool_(False))
    assert fs_manager.lookup(keys) == 0


# -- token ids -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "tokens",
    [
        [1.5] * 8,
        np.full(8, 7.25),
        [float("inf")] * 8,
        [float("nan")] * 8,
        [2**63] * 8,
        [2**64] * 8,
        np.full(8, 2**63, dtype=np.uint64),
        ["a"] * 8,
        [None] * 8,
    ],
    ids=["1.5", "np-7.25", "inf", "nan", "2**63", "2**64", "uint64-2**63", "str", "None"],
)
def test_token_ids_that_are_not_int64_integers_are_refused(identity, tokens):
    """``1.5`` was cut to ``1`` (and ``2**63`` as uint64 wrapped to ``-2**63``): another
    prompt's keys, so its KV."""
    with pytest.raises(InvalidKeyError, match="token_ids"):
        chunk_keys(tokens, identity)


def test_integral_floats_and_every_integer_dtype_key_as_the_ints(identity):
    ints = chunk_keys(list(range(16)), identity)
    for tokens in (np.arange(16, dtype=np.float64), np.arange(16, dtype=np.uint32)):
        assert chunk_keys(tokens, identity) == ints


def test_known_keys_given_as_bytes_come_back_as_chunk_keys_the_manager_takes(fs_manager, identity):
    tokens = np.arange(2 * identity.layout.tokens_per_chunk)
    first = chunk_keys(tokens, identity)
    keys = chunk_keys(tokens, identity, known=[bytes(first[0])])
    assert keys == first
    assert all(type(key) is ChunkKey for key in keys)
    assert fs_manager.lookup(keys) == 0


# -- layouts and identities ----------------------------------------------------------------
@pytest.mark.parametrize("window", [2.5, float("nan"), float("inf"), "4"])
def test_a_sliding_window_that_is_not_an_integer_is_refused(window):
    with pytest.raises(ConfigError, match="window"):
        LayerGroup("sliding", (0,), window=window)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields",
    [{"groups": None}, {"groups": [1]}, {"groups": "full"}, {"dtype": ["float32"]}],
    ids=["groups-None", "groups-int", "groups-str", "dtype-list"],
)
def test_a_layout_of_the_wrong_types_is_a_config_error(fields):
    with pytest.raises(ConfigError, match=r"^KVLayout"):
        KVLayout(**{"num_layers": 2, "num_kv_heads": 2, "head_dim": 16, **fields})


def test_a_layout_has_at_most_max_layers():
    """2**40 layers ran out of memory listing them (the default layer group) instead of being
    refused; the bound itself is a layout like any other."""
    from kvtier.layout import MAX_LAYERS

    with pytest.raises(ConfigError, match=r"KVLayout.num_layers: at most"):
        KVLayout(num_layers=2**40, num_kv_heads=1, head_dim=1)
    with pytest.raises(ConfigError, match=r"KVLayout.num_layers: at most"):
        KVLayout(num_layers=MAX_LAYERS + 1, num_kv_heads=1, head_dim=1)
    assert (
        len(KVLayout(num_layers=MAX_LAYERS, num_kv_heads=1, head_dim=1).layer_groups[0].layers)
        == MAX_LAYERS
    )


def test_bools_are_not_layer_indices():
    with pytest.raises(ConfigError, match="layers"):
        LayerGroup("full", (False, True))


@pytest.mark.parametrize(
    "fields",
    [
        {"model": None},
        {"revision": 1},
        {"fingerprint": None},
        {"layout": None},
        {"extra": None},
        {"extra": {"rope": 2}},
        {"extra": {1: "a"}},
    ],
    ids=["model", "revision", "fingerprint", "layout", "extra-None", "extra-int", "extra-key"],
)
def test_an_identity_of_the_wrong_types_is_a_config_error(fields):
    with pytest.raises(ConfigError, match=f"^CacheIdentity.{next(iter(fields))}"):
        CacheIdentity(**{"model": "m", "layout": SMALL_LAYOUT, **fields})


# -- the manager's arguments -----------------------------------------------------------------
def test_a_manager_given_a_dict_for_its_config_says_so(identity):
    with pytest.raises(ConfigError, match=r"^config: expected a TieringConfig"):
        TieringManager(dict(TOP), identity)  # type: ignore[arg-type]


def test_a_manager_given_no_identity_says_so():
    with pytest.raises(ConfigError, match=r"^identity"):
        TieringManager(config(4), None)  # type: ignore[arg-type]


@pytest.mark.parametrize("tiers", ["memory", [None], [5]], ids=["str", "None", "int"])
def test_a_manager_given_tiers_that_are_no_tiers_says_so(identity, tiers):
    with pytest.raises(ConfigError, match=r"^tiers"):
        TieringManager(config(4), identity, tiers=tiers)


def test_a_manager_that_refuses_its_arguments_closes_the_tiers_it_was_given(identity):
    region = HostRegion(1, SMALL_LAYOUT.chunk_bytes)
    tier = MemoryTier(MemoryTierConfig(), region, identity)
    closed: list[bool] = []
    original = tier.close
    tier.close = lambda: (closed.append(True), original())[1]  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match=r"^tiers"):
        TieringManager(config(4), identity, tiers=[tier, None])  # type: ignore[list-item]
    assert closed == [True]


def test_the_same_chunks_stored_twice_are_one_copy_that_survives_a_restart(identity, tmp_path):
    fs = {"type": "fs", "root_dir": str(tmp_path / "fs")}
    keys = make_keys(identity, 3)
    with TieringManager(config(8, secondary_tiers=[fs]), identity) as m:
        plan = m.prepare_store(keys)
        assert plan is not None
        for slot in plan.slots:
            m.region.view(slot)[:] = bytes([slot + 1]) * m.region.slot_bytes
        m.complete_store(plan.keys)
        again = m.prepare_store(keys)
        assert again is not None and again.keys == []
        assert m.wait_idle(30)
    with TieringManager(config(8, secondary_tiers=[fs]), identity) as m:
        assert settle(m, keys) == 3
        slots = m.prepare_load(keys)
        got = [bytes(m.region.view(slot))[:1] for slot in slots]
        m.complete_load(keys)
    assert got == [bytes([slot + 1]) for slot in plan.slots]
