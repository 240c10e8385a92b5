"""Sealed chunks between peers (issue 25, finding 1): a peer without the key chooses no KV.

Stores: a peer server that accepts stores (loopback, no CURVE) and writes through to a sealed
fs tier; the attacker (``tests/tiers/attacker.py``, a plain script that imports nothing of
kvtier's) speaks the peer protocol and STOREs planted chunks. Without a key they are taken and
served, and written through (the control: the finding); with one, none is taken. Fetches: a
client with a key loads nothing from a peer process that seals with another key, or not at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier import CacheIdentity, ChunkKey, TieringConfig, TieringManager
from kvtier.errors import ConfigError
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from tests.conftest import (
    collect,
    config,
    fill,
    holds,
    make_keys,
    on_a_free_port,
    settle,
    store,
    wait_for,
)
from tests.tiers.peer_node import PeerNode
from tests.tiers.sealing_keys import KEY_A, KEY_B, PLANTED, attack, key_file

pytest.importorskip("zmq")
pytest.importorskip("cryptography")


def serving(identity: CacheIdentity, root: Path, key: str | None) -> TieringManager:
    """A manager whose peer server accepts stores and writes through to an fs tier."""
    extra: dict[str, object] = {"secondary_tiers": [{"type": "fs", "root_dir": str(root)}]}
    if key is not None:
        extra["integrity_key_file"] = key

    def start(port: int) -> TieringManager:
        serve = {"port": port, "accept_stores": True}
        return TieringManager(config(16, serve=serve, **extra), identity)

    manager, _ = on_a_free_port(start)
    return manager


def plant(manager: TieringManager, identity: CacheIdentity, mode: str, keys: list[ChunkKey]) -> str:
    assert manager.peer_server is not None
    port, size = manager.peer_server.port, identity.layout.chunk_bytes
    (line,) = attack(
        "peer", str(port), identity.hexdigest, str(size), mode, *(k.hex() for k in keys)
    )
    return line


def chunk_files(root: Path, identity: CacheIdentity) -> set[str]:
    return {path.name for path in (root / identity.hexdigest).glob("??/??/*")}


def test_without_a_key_a_peer_that_stores_chooses_the_kv_served(tmp_path, identity):
    """The control: the attacker's chunks are taken, served, and written through to disk."""
    keys = make_keys(identity, 4)
    with serving(identity, tmp_path / "cache", None) as server:
        assert plant(server, identity, "v1", keys) == "stored 1111"
        assert settle(server, keys) == 4
        slots = server.prepare_load(keys)
        assert all(bytes(server.region.view(s)).startswith(PLANTED) for s in slots)
        server.complete_load(keys)
        assert server.wait_idle(10)
    assert chunk_files(tmp_path / "cache", identity) == {k.hex() for k in keys}


@pytest.mark.parametrize("mode, reason", [("v1", "unkeyed"), ("reuse", "forged"), ("v2", "forged")])
def test_with_a_key_a_peer_without_it_stores_nothing(tmp_path, identity, mode, reason):
    """The first key is genuine (the attacker fetches its sealed header for ``reuse``)."""
    genuine, *planted = make_keys(identity, 5)
    secret = key_file(tmp_path / "chunks.key", KEY_A)
    with serving(identity, tmp_path / "cache", secret) as server:
        store(server, [genuine])
        assert server.wait_idle(10)
        assert plant(server, identity, mode, [genuine, *planted]) == "stored 00000"
        assert server.peer_server is not None
        counters = server.peer_server.stats()
        assert counters[f"store_integrity.{reason}"] == 5
        assert [settle(server, [key]) for key in planted] == [0] * 4
        assert settle(server, [genuine]) == 1
        assert holds(server.region, server.prepare_load([genuine])[0], genuine)
        server.complete_load([genuine])
    assert chunk_files(tmp_path / "cache", identity) == {genuine.hex()}


@pytest.fixture
def region(identity: CacheIdentity) -> HostRegion:
    return HostRegion(8, identity.layout.chunk_bytes)


@pytest.fixture
def sealed_node(tmp_path_factory) -> Iterator[tuple[PeerNode, Path]]:
    """A peer process serving 4 chunks sealed with key A, accepting stores checked with it."""
    keys = tmp_path_factory.mktemp("keys")
    secret = key_file(keys / "a.key", KEY_A)
    node = PeerNode(0, "--store", "4", "--accept-stores", "--integrity-key", secret).start()
    yield node, keys
    node.kill()


def fetch(node: PeerNode, region: HostRegion, identity, keys, **options: object):
    tier = node.tier(region, identity, timeout_s=2.0, **options)
    try:
        for slot in range(len(keys)):
            region.view(slot)[:] = bytes(region.slot_bytes)
        tier.submit_load(TransferJob(1, tuple(keys), tuple(range(len(keys)))))
        return collect(tier, [1])[1], tier.stats()
    finally:
        tier.close()


def test_a_client_with_the_key_loads_sealed_chunks(sealed_node, region, identity):
    node, keys_dir = sealed_node
    keys = make_keys(identity, 4)
    result, _ = fetch(node, region, identity, keys, integrity_key_file=str(keys_dir / "a.key"))
    assert result.succeeded == set(keys)
    assert all(holds(region, slot, key) for slot, key in enumerate(keys))


def test_a_wrong_key_loads_nothing_from_a_peer_never_wrong_bytes(sealed_node, region, identity):
    node, keys_dir = sealed_node
    keys = make_keys(identity, 4)
    wrong = key_file(keys_dir / "b.key", KEY_B)
    result, stats = fetch(node, region, identity, keys, integrity_key_file=wrong)
    assert result.succeeded == frozenset() and result.integrity_failed == set(keys)
    assert stats["integrity.unknown_key"] == 4
    no_key, stats = fetch(node, region, identity, keys)
    assert no_key.succeeded == frozenset() and stats["integrity.keyed"] == 4


def test_a_keyed_client_loads_nothing_from_a_peer_that_does_not_seal(region, identity, tmp_path):
    """A peer without the key (or one serving bytes of its choosing) cannot make us load them."""
    node = PeerNode(0, "--store", "4").start()
    try:
        keys = make_keys(identity, 4)
        secret = key_file(tmp_path / "a.key", KEY_A)
        result, stats = fetch(node, region, identity, keys, integrity_key_file=secret)
        assert result.succeeded == frozenset() and stats["integrity.unkeyed"] == 4
    finally:
        node.kill()


def test_sealed_stores_round_trip_through_a_peer_with_the_key(sealed_node, region, identity):
    node, keys_dir = sealed_node
    keys = make_keys(identity, 3, seed=5)
    tier = node.tier(region, identity, timeout_s=2.0, integrity_key_file=str(keys_dir / "a.key"))
    try:
        for slot, key in enumerate(keys):
            fill(region, slot, key)
        settle_stores(tier)
        tier.submit_store(TransferJob(1, tuple(keys), (0, 1, 2)))
        assert collect(tier, [1])[1].ok
    finally:
        tier.close()
    result, _ = fetch(node, region, identity, keys, integrity_key_file=str(keys_dir / "a.key"))
    assert result.succeeded == set(keys)
    assert all(holds(region, slot, key) for slot, key in enumerate(keys))


def settle_stores(tier) -> None:
    """Wait until the tier knows its peer accepts stores (after the handshake)."""
    wait_for(lambda: tier.accepts_stores, what="the peer's handshake")


def test_stores_need_curve_or_the_key_while_tiers_seal(tmp_path):
    secret = key_file(tmp_path / "a.key", KEY_A)
    sealed_fs = [{"type": "fs", "root_dir": str(tmp_path), "integrity_key_file": secret}]
    open_stores = {"port": 5710, "accept_stores": True}
    with pytest.raises(ConfigError, match=r"^serve\.accept_stores: refused without CURVE or integ"):
        TieringConfig.from_dict(
            {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": sealed_fs, "serve": open_stores}
        )
    checked = {**open_stores, "integrity_key_file": secret}
    assert TieringConfig.from_dict(
        {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": sealed_fs, "serve": checked}
    ).serve.accept_stores  # type: ignore[union-attr]
    top = TieringConfig.from_dict(
        {"cpu_bytes_to_use": 1 << 20, "integrity_key_file": secret, "serve": open_stores}
    )
    assert top.serve is not None and top.serve.integrity_key_file == secret
