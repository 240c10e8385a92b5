"""The top-level ``integrity_key_file``: every tier's and ``serve``'s default, and the checks
that span tiers (``kvtier.config.integrity``)."""

from __future__ import annotations

import pytest

from kvtier import TieringConfig
from kvtier.errors import ConfigError

BASE = {"cpu_bytes_to_use": 1 << 30}


def parsed(**extra: object) -> TieringConfig:
    return TieringConfig.from_dict({**BASE, **extra})


def test_the_top_level_key_is_every_tier_s_default_and_a_tier_s_own_wins():
    tiers = [
        {"type": "fs", "root_dir": "/a"},
        {"type": "obj", "bucket": "b"},
        {"type": "p2p", "host": "10.0.0.2", "port": 5710},
        {"type": "fault", "inner": {"type": "fs", "root_dir": "/c"}},
        {"type": "fs", "root_dir": "/d", "integrity_key_file": "/own.key"},
        {"type": "x", "module_path": "somewhere.tiers", "flavour": 1},
    ]
    config = parsed(integrity_key_file="/all.key", secondary_tiers=tiers, serve={"port": 5710})
    fs, obj, p2p, fault, own, external = config.secondary_tiers
    assert fs.integrity_key_file == obj.integrity_key_file == p2p.integrity_key_file == "/all.key"
    assert fault.inner.integrity_key_file == "/all.key"
    assert own.integrity_key_file == "/own.key"
    assert dict(external.options) == {"flavour": 1}
    assert config.serve is not None and config.serve.integrity_key_file == "/all.key"


def test_without_a_top_level_key_nothing_changes():
    config = parsed(secondary_tiers=[{"type": "fs", "root_dir": "/a"}])
    assert config.secondary_tiers[0].integrity_key_file is None


def test_encrypt_needs_a_key_on_the_tier_or_at_the_top():
    entry = {"type": "obj", "bucket": "b", "encrypt": True}
    with pytest.raises(ConfigError, match=r"^secondary_tiers\[1\]\.encrypt: needs integrity_key"):
        parsed(secondary_tiers=[{"type": "fs", "root_dir": "/a"}, entry])
    assert parsed(integrity_key_file="/k", secondary_tiers=[entry]).secondary_tiers[0].encrypt


def test_open_peer_stores_are_refused_while_a_tier_seals_unless_checked():
    sealed = [{"type": "fs", "root_dir": "/a", "integrity_key_file": "/k"}]
    with pytest.raises(ConfigError, match=r"^serve\.accept_stores: refused without CURVE"):
        parsed(secondary_tiers=sealed, serve={"port": 5710, "accept_stores": True})
    inner = [{"type": "fault", "inner": sealed[0]}]
    with pytest.raises(ConfigError, match=r"^serve\.accept_stores"):
        parsed(secondary_tiers=inner, serve={"port": 5710, "accept_stores": True})
    checked = {"port": 5710, "accept_stores": True, "integrity_key_file": "/k"}
    assert parsed(secondary_tiers=sealed, serve=checked).serve is not None
    unsealed = [{"type": "fs", "root_dir": "/a"}]
    assert parsed(secondary_tiers=unsealed, serve={"port": 5710, "accept_stores": True}).serve


def test_config_check_warns_about_a_group_writable_cache_without_a_key():
    from kvtier.config.describe import config_warnings

    tiers = [
        {"type": "fs", "root_dir": "/shared", "dir_mode": "0770"},
        {"type": "fs", "root_dir": "/sealed", "dir_mode": "0770", "integrity_key_file": "/k"},
        {"type": "fs", "root_dir": "/read", "dir_mode": "0750"},
    ]
    warnings = [w for w in config_warnings(parsed(secondary_tiers=tiers)) if "dir_mode" in w]
    assert len(warnings) == 1 and warnings[0].startswith("fs root_dir /shared: dir_mode 0770")
