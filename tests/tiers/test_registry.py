"""Tiers built from configuration: built-in types and classes loaded by module_path."""

from __future__ import annotations

import socket
import threading

import pytest

from kvtier import ConfigError, TieringManager
from kvtier.tiers.fault import FaultInjectingTier
from kvtier.tiers.memory import MemoryTier
from tests.conftest import config
from tests.plugins import outside_tier

PLUGIN = "tests.plugins.outside_tier"


def manager_with(identity, *tiers):
    return TieringManager(config(4, secondary_tiers=list(tiers)), identity)


def test_builtin_and_fault_types(identity):
    with manager_with(
        identity,
        {"type": "memory", "name": "ram"},
        {"type": "fault", "inner": {"type": "memory"}, "fail_load": True},
    ) as m:
        ram, fault = m.tiers
        assert isinstance(ram, MemoryTier) and ram.name == "ram"
        assert isinstance(fault, FaultInjectingTier) and fault.fail_load
        assert isinstance(fault.inner, MemoryTier)


def test_module_path_with_validated_options(identity):
    with manager_with(
        identity,
        {"module_path": PLUGIN, "type": "PrefixedMemoryTier", "label": "x", "name": "outside"},
    ) as m:
        (tier,) = m.tiers
        assert type(tier).__name__ == "PrefixedMemoryTier" and tier.label == "x"
        assert tier.name == "outside"


def test_module_path_with_plain_options(identity):
    with manager_with(identity, {"module_path": PLUGIN, "type": "UntypedTier", "a": 1}) as m:
        assert m.tiers[0].options == {"a": 1}


def test_every_tier_is_built_as_config_region_identity(identity):
    """One constructor signature for every tier: an outside tier's options arrive read-only."""
    with manager_with(identity, {"module_path": PLUGIN, "type": "UntypedTier", "x": 1}) as m:
        (tier,) = m.tiers
        assert tier.options == {"x": 1}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"module_path": "no.such.module", "type": "X"}, "cannot import 'no.such.module'"),
        ({"module_path": ".relative", "type": "X"}, "expected a dotted module name"),
        ({"module_path": "tests.plugins.broken_at_import", "type": "X"}, "a bug at import"),
        ({"module_path": PLUGIN, "type": "Missing"}, "has no class 'Missing'"),
        ({"module_path": PLUGIN, "type": "NotATier"}, "is not a tier"),
        (
            {"module_path": PLUGIN, "type": "PrefixedMemoryTier"},
            "PrefixedMemoryTier.label: required",
        ),
        (
            {"module_path": PLUGIN, "type": "PrefixedMemoryTier", "label": 3},
            "label: expected a string",
        ),
        ({"type": "fault", "inner": {"type": "memory"}, "fail_keys": ["zz"]}, "fail_keys"),
        (
            {"module_path": PLUGIN, "type": "KeywordTier", "label": "k"},
            r"KeywordTier must be built as KeywordTier\(config, region, identity\)",
        ),
    ],
)
def test_clear_errors(identity, entry, message):
    with pytest.raises(ConfigError, match=message):
        manager_with(identity, entry)


def test_a_tier_failing_to_start_closes_the_ones_already_built(identity, tmp_path):
    before = set(threading.enumerate())
    outside_tier.CLOSED.clear()
    closing = {"module_path": PLUGIN, "type": "ClosingTier"}
    with pytest.raises(RuntimeError, match="cannot start"):
        manager_with(
            identity,
            {**closing, "label": "first"},
            {"type": "fs", "root_dir": str(tmp_path)},
            {**closing, "label": "third"},
            {"module_path": PLUGIN, "type": "BrokenTier"},
            {**closing, "label": "never built"},
        )
    assert outside_tier.CLOSED == ["first", "third"]
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []


def test_a_manager_failing_to_start_for_another_reason_closes_its_tiers(identity):
    """Its tiers are built, then the metrics port turns out to be taken: the tiers are closed."""
    outside_tier.CLOSED.clear()
    closing = {"module_path": PLUGIN, "type": "ClosingTier", "label": "metered"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match="cannot listen"):
            TieringManager(config(4, secondary_tiers=[closing], metrics_port=port), identity)
    assert outside_tier.CLOSED == ["metered"]
