"""Tier factories for the conformance suite.

Every registered tier type (``kvtier.tiers.catalog``) is under test: each provides a fixture
named ``<type>_tier_factory`` returning a callable ``(region, identity) -> SecondaryTier``. A
type registered without one fails the suite (``fixture ... not found``) until it has one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kvtier.config import FsTierConfig, MemoryTierConfig
from kvtier.identity import CacheIdentity
from kvtier.region import HostRegion
from kvtier.tiers.base import SecondaryTier
from kvtier.tiers.catalog import TIER_TYPES
from kvtier.tiers.fault import FaultInjectingTier
from kvtier.tiers.fs import native
from kvtier.tiers.fs.tier import FilesystemTier
from kvtier.tiers.memory import MemoryTier
from tests.tiers.peer_node import PeerNode
from tests.tiers.s3_server import MotoServer, s3_server  # noqa: F401 (s3_server is a fixture)

TierFactory = Callable[[HostRegion, CacheIdentity], SecondaryTier]

CONFORMING_TIERS = list(TIER_TYPES)


@pytest.fixture(params=["native", "os"])
def fs_io(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test twice: chunk files through the compiled ``_fastio`` (the default where it
    is built), and through the ``os``-module path every platform has."""
    if request.param == "native" and not native.AVAILABLE:
        pytest.skip("kvtier.tiers.fs._fastio is not built here")
    if request.param == "os":
        monkeypatch.setattr(native, "_fastio", None)
    return str(request.param)


@pytest.fixture
def memory_tier_factory() -> TierFactory:
    return lambda region, identity: MemoryTier(MemoryTierConfig(), region, identity)


@pytest.fixture
def fault_tier_factory() -> TierFactory:
    """A fault-injecting wrapper with no faults set must behave exactly like its inner tier."""

    def make(region: HostRegion, identity: CacheIdentity) -> SecondaryTier:
        return FaultInjectingTier(MemoryTier(MemoryTierConfig(), region, identity))

    return make


@pytest.fixture
def obj_tier_factory(request: pytest.FixtureRequest) -> TierFactory:
    """An object store tier on the session's moto server, under a fresh prefix each time."""
    server: MotoServer = request.getfixturevalue("s3_server")
    return lambda region, identity: server.tier("kvtier", region, identity)


@pytest.fixture
def fs_tier_factory(tmp_path_factory: pytest.TempPathFactory) -> TierFactory:
    """A filesystem tier over a fresh directory (default options)."""
    root = str(tmp_path_factory.mktemp("fs-tier"))
    return lambda region, identity: FilesystemTier(FsTierConfig(root_dir=root), region, identity)


@pytest.fixture(scope="session")
def p2p_server() -> Iterator[PeerNode]:
    """A kvtier instance in another process, serving its host tier and accepting stores."""
    node = PeerNode(0, "--accept-stores").start()
    yield node
    node.stop()


@pytest.fixture
def p2p_tier_factory(p2p_server: PeerNode) -> TierFactory:
    """A p2p tier whose only peer is the session's serving instance."""
    return p2p_server.tier


@pytest.fixture(params=CONFORMING_TIERS)
def tier_factory(request: pytest.FixtureRequest) -> TierFactory:
    factory: TierFactory = request.getfixturevalue(f"{request.param}_tier_factory")
    return factory
