"""Old module paths keep working, with a DeprecationWarning naming the new one (kvtier._moved)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from kvtier._moved import MOVED, new_name

NEEDS_VLLM = {"kvtier.integrations.vllm.cache_policy"}


@pytest.mark.parametrize("old", sorted(set(MOVED) - NEEDS_VLLM))
def test_an_old_path_is_the_new_module_with_a_warning(old: str) -> None:
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({MOVED[old]!r})\n"
        "assert old is new, (old, new)\n"
        "assert any(issubclass(w.category, DeprecationWarning) and\n"
        f"           {MOVED[old]!r} in str(w.message) for w in caught), caught\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_moved_packages_submodules_follow_it() -> None:
    assert new_name("kvtier.admission.gate") == "kvtier.control.admission.gate"
    assert new_name("kvtier.admission.policies") == "kvtier.control.admission.rules"
    assert new_name("kvtier.core.manager") is None  # a current path is left alone
    with pytest.warns(DeprecationWarning, match="kvtier.control.admission.gate"):
        old = importlib.import_module("kvtier.admission.gate")
    assert old is importlib.import_module("kvtier.control.admission.gate")


def test_the_config_names_users_import_are_still_in_kvtier_config() -> None:
    import kvtier.config as config

    for name in (
        "TieringConfig",
        "FsTierConfig",
        "ObjTierConfig",
        "P2PTierConfig",
        "MemoryTierConfig",
        "FaultTierConfig",
        "ExternalTierConfig",
        "ServeConfig",
        "PeerAddress",
        "KVEventsConfig",
        "RuntimeConfig",
        "TIER_CONFIGS",
    ):
        assert hasattr(config, name), name
