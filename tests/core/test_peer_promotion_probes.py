"""A peer's request costs a bounded number of tier probes (``Promoter.promote_for_peer``).

The fs tier is real: a key it has not indexed is probed with a ``stat``, on its probe threads
(``probe: background``: the key is on its way until the probe answers) or on the caller's
thread (``inline``: the key is simply not held); ``probe_misses`` counts the probes that found
nothing.
"""

from __future__ import annotations

import pytest

from kvtier import TieringConfig, TieringManager
from kvtier.core.promotion import PROBE_AHEAD
from tests.conftest import make_keys, push_out, store, wait_for

MODES = ["background", "inline"]


def fs_manager(tmp_path, identity, probe: str, slots: int = 8) -> TieringManager:
    stride = -(-identity.layout.chunk_bytes // 4096) * 4096
    fs = {"type": "fs", "root_dir": str(tmp_path / "fs"), "probe": probe}
    config = TieringConfig.from_dict({"cpu_bytes_to_use": slots * stride, "secondary_tiers": [fs]})
    m = TieringManager(config, identity)
    assert m.tiers[0].wait_scanned(10)
    return m


def probes_settle(m: TieringManager, expected: int) -> None:
    """Wait until ``expected`` probes have found nothing, then check no more come."""
    tier = m.tiers[0]
    wait_for(lambda: tier.stats().get("probe_misses", 0) >= expected, what=f"{expected} probes")
    m.wait_idle(1.0)
    assert tier.stats().get("probe_misses", 0) == expected


@pytest.mark.parametrize("probe", MODES)
def test_a_peer_asking_for_many_unknown_keys_starts_only_probe_ahead_probes(
    tmp_path, identity, probe
):
    m = fs_manager(tmp_path, identity, probe)
    unknown = make_keys(identity, 1024, seed=7)
    coming = m.promote_for_peer(unknown)
    probed = set(unknown[:PROBE_AHEAD]) if probe == "background" else set()
    assert coming == probed, "the keys being probed are on their way, no more"
    probes_settle(m, PROBE_AHEAD)
    m.close()


@pytest.mark.parametrize("probe", MODES)
@pytest.mark.parametrize("held", [PROBE_AHEAD - 4, PROBE_AHEAD + 8])
def test_keys_found_held_raise_the_budget_as_lookups_walk_does(tmp_path, identity, held, probe):
    m = fs_manager(tmp_path, identity, probe)
    stored = make_keys(identity, held, seed=3)
    for start in range(0, held, 4):
        store(m, stored[start : start + 4])
        push_out(m, identity, 8, seed=5000 + start)  # leaves host memory, stays in the fs tier
    unknown = make_keys(identity, 200, seed=9)
    coming = m.promote_for_peer([*stored, *unknown])
    budget = max(PROBE_AHEAD, held)
    assert coming & set(unknown) == (set(unknown[:budget]) if probe == "background" else set())
    probes_settle(m, budget)
    m.close()
