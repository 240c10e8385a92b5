"""Promotion timing: what a lookup starts while tiers are still finding out."""

from __future__ import annotations

from kvtier import RETRY, ChunkKey, TieringManager
from kvtier.config import MemoryTierConfig
from kvtier.tiers.base import Lookup
from kvtier.tiers.fault import FaultInjectingTier
from kvtier.tiers.memory import MemoryTier
from tests.conftest import config, make_keys, push_out, read, settle, store


class Probing(FaultInjectingTier):
    """Answers RETRY for the keys in ``probing`` (a probe still running), then MISS."""

    def __init__(self, inner: MemoryTier) -> None:
        super().__init__(inner)
        self.probing: set[ChunkKey] = set()
        self.probed: set[ChunkKey] = set()

    def lookup(self, key: ChunkKey) -> Lookup:
        if key in self.probing:
            return RETRY if key not in self.probed else Lookup.MISS
        return super().lookup(key)


def test_held_chunks_are_promoted_while_a_later_key_is_still_probed(identity):
    """The prefix needs the chunks held before the probed key whatever the probe finds, so
    their promotion starts with the probe instead of after it; the answer stays exact."""
    keys = make_keys(identity, 4)
    m = TieringManager(
        config(8),
        identity,
        tiers=[lambda region, identity: Probing(MemoryTier(MemoryTierConfig(), region, identity))],
    )
    tier = m.tiers[0]
    assert isinstance(tier, Probing)
    try:
        store(m, keys[:3])
        push_out(m, identity, 8)
        tier.probing.add(keys[3])
        assert m.lookup(keys) is RETRY
        assert tier.calls["load"] == 1  # started before the probe answered
        tier.probed.add(keys[3])
        assert settle(m, keys) == 3 and read(m, keys[:3])
        assert tier.calls["load"] == 1
    finally:
        m.close()
