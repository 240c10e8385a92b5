"""Configuration: the vLLM shapes parse as written; every bad value names its key."""

from __future__ import annotations

import json

import pytest

from kvtier import ConfigError, TieringConfig
from kvtier.config import (
    ExternalTierConfig,
    FaultTierConfig,
    FsTierConfig,
    MemoryTierConfig,
    ObjTierConfig,
    P2PTierConfig,
    PeerAddress,
)

FS = {"type": "fs", "root_dir": "/mnt/kv-cache"}
OBJ = {"type": "obj", "bucket": "my-kv-cache", "endpoint_override": "http://minio:9000"}
P2P = {"type": "p2p", "host": "10.0.0.1", "port": 5710}


def wrapped(tier: dict) -> dict:
    return {
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 107374182400,
            "secondary_tiers": [tier],
        }
    }


@pytest.mark.parametrize(
    ("tier", "expected"),
    [
        (FS, FsTierConfig(root_dir="/mnt/kv-cache")),
        (OBJ, ObjTierConfig(bucket="my-kv-cache", endpoint_override="http://minio:9000")),
        (P2P, P2PTierConfig(host="10.0.0.1", port=5710)),
    ],
)
def test_issue_examples_parse_as_written(tier, expected):
    config = TieringConfig.from_json(json.dumps(wrapped(tier)))
    assert config.cpu_bytes_to_use == 107374182400
    assert config.spec_name == "TieringOffloadingSpec"
    assert config.secondary_tiers == (expected,)


def test_full_vllm_form_with_every_option():
    text = json.dumps(
        {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "TieringOffloadingSpec",
                "cpu_bytes_to_use": 1 << 30,
                "block_size": 16,
                "eviction_policy": "lru",
                "secondary_tiers": [{**FS, "n_read_threads": 8, "n_write_threads": 4}],
            },
        }
    )
    config = TieringConfig.from_json(text)
    assert (config.kv_connector, config.kv_role) == ("OffloadingConnector", "kv_both")
    assert config.block_size == 16 and config.eviction_policy == "lru"
    (fs,) = config.secondary_tiers
    assert isinstance(fs, FsTierConfig) and (fs.n_read_threads, fs.n_write_threads) == (8, 4)


def test_extra_config_alone_is_accepted():
    config = TieringConfig.from_dict({"cpu_bytes_to_use": 4096, "eviction_policy": "arc"})
    assert config.eviction_policy == "arc" and config.secondary_tiers == ()


def test_nested_store_config_and_peer_list():
    config = TieringConfig.from_dict(
        {
            "cpu_bytes_to_use": 4096,
            "secondary_tiers": [
                {
                    "type": "obj",
                    "store_config": {"bucket": "b1", "access_key": "AK", "secret_key": "SK"},
                },
                {"type": "p2p", "peers": [{"host": "a", "port": 1}, {"host": "b", "port": 2}]},
            ],
        }
    )
    obj, p2p = config.secondary_tiers
    assert isinstance(obj, ObjTierConfig) and obj.bucket == "b1" and obj.secret_key == "SK"
    assert "SK" not in repr(obj) and "AK" not in repr(obj)
    assert isinstance(p2p, P2PTierConfig)
    assert p2p.peers == (PeerAddress("a", 1), PeerAddress("b", 2))


def test_module_path_tier_keeps_its_options():
    config = TieringConfig.from_dict(
        {
            "cpu_bytes_to_use": 4096,
            "secondary_tiers": [
                {
                    "module_path": "my.tiers",
                    "type": "RedisTier",
                    "url": "redis://x",
                    "name": "redis",
                }
            ],
        }
    )
    assert config.secondary_tiers == (
        ExternalTierConfig("my.tiers", "RedisTier", {"url": "redis://x"}, "redis"),
    )


def test_fault_tier_wraps_a_parsed_inner_tier():
    config = TieringConfig.from_dict(
        {
            "cpu_bytes_to_use": 4096,
            "secondary_tiers": [
                {
                    "type": "fault",
                    "inner": {"type": "memory", "capacity_bytes": 100},
                    "fail_load": True,
                }
            ],
        }
    )
    (fault,) = config.secondary_tiers
    assert isinstance(fault, FaultTierConfig) and fault.fail_load
    assert fault.inner == MemoryTierConfig(capacity_bytes=100)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "cpu_bytes_to_use: required"),
        ({"cpu_bytes_to_use": 0}, "cpu_bytes_to_use: expected a positive integer"),
        ({"cpu_bytes_to_use": -5}, "cpu_bytes_to_use: expected a positive integer"),
        ({"cpu_bytes_to_use": "1GB"}, "cpu_bytes_to_use: expected an integer"),
        ({"cpu_bytes_to_use": True}, "cpu_bytes_to_use: expected an integer"),
        ({"cpu_bytes_to_use": 1.5}, "cpu_bytes_to_use: expected an integer"),
        ({"cpu_bytes_to_use": 1, "cpu_byte_to_use": 1}, "cpu_byte_to_use: unknown key"),
        (
            {"cpu_bytes_to_use": 1, "block_size": 16, "blocks_per_chunk": 2},
            "block_size, blocks_per_chunk",
        ),
        ({"cpu_bytes_to_use": 1, "block_size": 0}, "block_size: expected a positive integer"),
        ({"cpu_bytes_to_use": 1, "eviction_policy": "lfu"}, "eviction_policy: expected one of"),
        ({"cpu_bytes_to_use": 1, "secondary_tiers": {}}, "secondary_tiers: expected a list"),
        (
            {"cpu_bytes_to_use": 1, "secondary_tiers": ["fs"]},
            "secondary_tiers[0]: expected a JSON object",
        ),
        (
            {"cpu_bytes_to_use": 1, "secondary_tiers": [{"root_dir": "/x"}]},
            "secondary_tiers[0].type: expected one of",
        ),
        (
            {"cpu_bytes_to_use": 1, "secondary_tiers": [{"type": "tape"}]},
            "secondary_tiers[0].type: expected one of",
        ),
        (
            {"cpu_bytes_to_use": 1, "secondary_tiers": [{"type": "fs"}]},
            "secondary_tiers[0].root_dir: required",
        ),
        (
            {"cpu_bytes_to_use": 1, "secondary_tiers": [{**FS, "n_read_threads": "8"}]},
            "secondary_tiers[0].n_read_threads: expected an integer",
        ),
        (
            {"cpu_bytes_to_use": 1, "secondary_tiers": [{**FS, "n_read_threads": 0}]},
            "secondary_tiers[0].n_read_threads: expected a positive integer",
        ),
        (
            {"cpu_bytes_to_use": 1, "secondary_tiers": [{**FS, "fsync": "yes"}]},
            "secondary_tiers[0].fsync: expected true or false",
        ),
        (
            {"cpu_bytes_to_use": 1, "secondary_tiers": [{**FS, "o_direct": "maybe"}]},
            "secondary_tiers[0].o_direct: expected one of",
        ),
        (
            {"cpu_bytes_to_use": 1, "secondary_tiers": [{**FS, "colour": 1}]},
            "secondary_tiers[0].colour: unknown key",
        ),
        (
            {"cpu_bytes_to_use": 1, "secondary_tiers": [{**P2P, "port": "x"}]},
            "secondary_tiers[0].port: expected an integer",
        ),
        (
            {"cpu_bytes_to_use": 1, "secondary_tiers": [{"type": "p2p", "peers": [{"host": "a"}]}]},
            "secondary_tiers[0].peers[0].port: required",
        ),
        (
            {"cpu_bytes_to_use": 1, "secondary_tiers": [{"type": "fault", "inner": {"type": "x"}}]},
            "secondary_tiers[0].inner.type: expected one of",
        ),
        (
            {"cpu_bytes_to_use": 1, "secondary_tiers": [{"module_path": "m"}]},
            "secondary_tiers[0].type: expected the tier's class name",
        ),
        (
            {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {}},
            "cpu_bytes_to_use: required",
        ),
        (
            {"kv_connector": "X", "kv_conector_extra_config": {}},
            "kv_conector_extra_config: unknown key",
        ),
        ({"kv_connector_extra_config": []}, "kv_connector_extra_config: expected a JSON object"),
    ],
)
def test_bad_values_name_the_key(data, message):
    with pytest.raises(ConfigError) as info:
        TieringConfig.from_dict(data)
    assert message in str(info.value)


def test_not_json_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid JSON"):
        TieringConfig.from_json("{cpu_bytes_to_use: 1")
    with pytest.raises(ConfigError, match="configuration: expected a JSON object"):
        TieringConfig.from_json("[1, 2]")
    with pytest.raises(ConfigError, match=r"nope\.json"):
        TieringConfig.load(tmp_path / "nope.json")


def test_load_reads_a_file(tmp_path):
    path = tmp_path / "kv.json"
    path.write_text(json.dumps(wrapped(FS)))
    assert TieringConfig.load(path) == TieringConfig.from_json(path.read_text())


def test_configs_are_frozen():
    config = TieringConfig.from_dict({"cpu_bytes_to_use": 1})
    with pytest.raises(AttributeError):
        config.cpu_bytes_to_use = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("extra", "engine_block", "expected"),
    [({}, 16, None), ({"blocks_per_chunk": 4}, 16, 4), ({"block_size": 256}, 16, 16)],
)
def test_blocks_per_chunk_resolution(extra, engine_block, expected):
    config = TieringConfig.from_dict({"cpu_bytes_to_use": 1, **extra})
    assert config.blocks_per_chunk_for(engine_block) == expected


def test_block_size_must_be_a_multiple_of_engine_blocks():
    config = TieringConfig.from_dict({"cpu_bytes_to_use": 1, "block_size": 100})
    with pytest.raises(ConfigError, match="block_size: expected a multiple"):
        config.blocks_per_chunk_for(16)
