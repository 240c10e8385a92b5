"""The vLLM-free parts of ``kvtier.integrations.vllm`` (these run without vLLM installed)."""

from __future__ import annotations

import dataclasses
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from kvtier.config import FsTierConfig, ObjTierConfig
from kvtier.errors import ConfigError
from kvtier.integrations.vllm.identity import (
    KeyMap,
    identity_from_config,
    identity_from_description,
)
from kvtier.integrations.vllm.metrics import CounterBridge, tier_label
from kvtier.integrations.vllm.options import adapter_options, fit_to_region, tier_config
from kvtier.integrations.vllm.region import PrimaryRegion
from tests.model_dir import write_model

LAYERS = tuple(f"model.layers.{i}.self_attn.attn" for i in range(4))


@dataclasses.dataclass(frozen=True)
class Parallel:
    rank: int = 0
    world_size: int = 1
    tp_size: int = 1
    pp_size: int = 1
    pcp_size: int = 1
    dcp_size: int = 1
    is_parallelism_agnostic: bool = False


def vllm_config(**changes: object) -> SimpleNamespace:
    """The attributes of vLLM's OffloadingConfig that the identity reads."""
    base = dict(
        model=SimpleNamespace(name="org/model", dtype="float32"),
        groups=(SimpleNamespace(tokens_per_block=16, layer_names=LAYERS, group_id=0),),
        cache=SimpleNamespace(tokens_per_hash=16, blocks_per_chunk=4),
        parallel=Parallel(),
        worker_kv_bytes_per_block=4 * 2 * 2 * 16 * 64 * 4,
        canonical_layout=False,
        replicated_layout=False,
        kv_cache_layout="NHD",
    )
    return SimpleNamespace(**{**base, **changes})


def test_engines_of_one_model_and_layout_share_an_identity():
    assert identity_from_config(vllm_config()).digest == identity_from_config(vllm_config()).digest


@pytest.mark.parametrize(
    "changes",
    [
        {"model": SimpleNamespace(name="org/other", dtype="float32")},
        {"model": SimpleNamespace(name="org/model", dtype="bfloat16")},
        {"cache": SimpleNamespace(tokens_per_hash=16, blocks_per_chunk=8)},
        {"parallel": Parallel(world_size=2, tp_size=2)},
        {"canonical_layout": True},
        {"groups": (SimpleNamespace(tokens_per_block=32, layer_names=LAYERS, group_id=0),)},
        {"worker_kv_bytes_per_block": 1024},
    ],
)
def test_any_difference_gives_another_namespace(changes):
    assert (
        identity_from_config(vllm_config(**changes)).digest
        != identity_from_config(vllm_config()).digest
    )


def test_the_layout_has_vllms_chunk_size_and_the_identity_round_trips():
    config = vllm_config()
    identity = identity_from_config(config)
    assert identity.layout.chunk_bytes == config.worker_kv_bytes_per_block * 4
    again = identity_from_description(identity.describe())
    assert again.digest == identity.digest


def test_a_local_model_is_identified_by_its_content_not_its_path(tmp_path):
    """vLLM's ``--model`` path: two copies share an identity, changed weights do not."""
    first = write_model(tmp_path / "mnt" / "m")
    second = shutil.copytree(first, tmp_path / "models" / "m-copy")
    model = SimpleNamespace(name=str(first), dtype="float32")
    identity = identity_from_config(vllm_config(model=model))
    copy = identity_from_config(
        vllm_config(model=SimpleNamespace(name=str(second), dtype="float32"))
    )
    assert (identity.model, copy.model) == ("m", "m-copy")
    assert identity.fingerprint.startswith("sha256-") and identity.digest == copy.digest
    assert identity_from_description(copy.describe()).digest == identity.digest
    assert identity_from_config(vllm_config(model=model), revision="r2").digest != identity.digest
    write_model(first, shape=(32, 128))  # another weight file under the same path
    assert identity_from_config(vllm_config(model=model)).digest != identity.digest


def test_offload_keys_map_to_chunk_keys_deterministically_and_back():
    identity = identity_from_config(vllm_config())
    offload_key = bytes(range(32)) + (1).to_bytes(4, "big")
    first, second = KeyMap(identity), KeyMap(identity)
    key = first.chunk_key(offload_key)
    assert key == second.chunk_key(offload_key) and len(key) == 32
    assert first.offload_key(key) == offload_key
    other = KeyMap(identity_from_config(vllm_config(canonical_layout=True)))
    assert other.chunk_key(offload_key) != key
    assert first.chunk_key(bytes(range(32)) + (2).to_bytes(4, "big")) != key
    forgetful = KeyMap(identity, remember=0)  # no KV events: nothing to map back
    assert forgetful.chunk_key(offload_key) == key and forgetful.offload_key(key) is None


def test_flat_options_are_checked_by_kvtiers_parser_with_the_key_named(tmp_path):
    assert tier_config("fs", {"root_dir": str(tmp_path)}, "KvtierFs") == FsTierConfig(
        root_dir=str(tmp_path)
    )
    with pytest.raises(ConfigError, match=r"^KvtierFs\.max_bytes"):
        tier_config("fs", {"root_dir": str(tmp_path), "max_bytes": -1}, "KvtierFs")
    with pytest.raises(ConfigError, match=r"^KvtierFs\.rootdir: unknown key"):
        tier_config("fs", {"rootdir": str(tmp_path)}, "KvtierFs")
    with pytest.raises(ConfigError, match=r"^KvtierObj\.bucket: required"):
        tier_config("obj", {}, "KvtierObj")


def test_a_nested_kvtier_entry_is_any_tier():
    assert isinstance(
        tier_config(None, {"kvtier": {"type": "obj", "bucket": "b"}}, "KvtierTier"), ObjTierConfig
    )
    with pytest.raises(ConfigError, match=r"^KvtierTier\.kvtier: required"):
        tier_config(None, {}, "KvtierTier")
    with pytest.raises(ConfigError, match=r"^KvtierTier\.root_dir: unknown key"):
        tier_config(None, {"root_dir": "/x"}, "KvtierTier")


def test_the_adapters_own_options_are_split_off_and_checked():
    own, rest = adapter_options({"locality": "remote", "root_dir": "/x"}, "KvtierFs")
    assert own == {"locality": "remote"} and rest == {"root_dir": "/x"}
    with pytest.raises(ConfigError, match=r"^KvtierFs\.locality"):
        adapter_options({"locality": "moon"}, "KvtierFs")
    own, _ = adapter_options({"secondary_min_priority": 50}, "KvtierFs")
    assert own == {"secondary_min_priority": 50}
    for bad in (101, -1, True, 50.0, "50"):
        with pytest.raises(ConfigError, match=r"^KvtierFs\.secondary_min_priority"):
            adapter_options({"secondary_min_priority": bad}, "KvtierFs")


def primary_view(chunks: int, stride: int) -> tuple[np.ndarray, memoryview]:
    array = np.zeros((chunks, stride), dtype=np.int8)
    return array, memoryview(array)


def test_the_region_is_vllms_rows_without_a_copy():
    array, view = primary_view(3, 8192)
    region = PrimaryRegion(view)
    assert (region.num_slots, region.slot_bytes) == (3, 8192)
    region.view(1)[:3] = b"abc"
    region.numpy(2)[0] = 7
    assert array[1, :3].tobytes() == b"abc" and array[2, 0] == 7
    region.release()
    view.release()  # nothing of the region still holds vLLM's view


def test_o_direct_is_off_where_rows_are_not_aligned(tmp_path):
    _, view = primary_view(2, 4000)
    region = PrimaryRegion(view)
    assert fit_to_region(FsTierConfig(root_dir=str(tmp_path)), region).o_direct == "off"
    region.release()


def test_counters_become_increments_under_vllms_tier_label():
    entries = [
        {"type": "fs", "root_dir": "/a"},
        {"type": "KvtierFs", "module_path": "m", "root_dir": "/b"},
    ]
    label = tier_label(entries, "KvtierFs", {"root_dir": "/b"})
    assert label == "2:KvtierFs"
    bridge = CounterBridge(label)
    assert bridge.increments({"loaded_chunks": 3}) == {"loaded_chunks": 3}
    assert bridge.increments({"loaded_chunks": 3, "stored_chunks": 1}) == {"stored_chunks": 1}
