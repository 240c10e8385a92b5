"""CURVE between real processes: keys from ``kvtier peer keygen``, an allow-list, refusals,
real chunk sizes, and what a server may expose without CURVE."""

from __future__ import annotations

import logging
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier import CacheIdentity, KVLayout, TieringConfig, TieringManager
from kvtier.cli.main import main
from kvtier.config import P2PTierConfig, ServeConfig
from kvtier.errors import ConfigError
from kvtier.region import HostRegion
from kvtier.tiers.base import HIT, MISS, TransferJob
from kvtier.tiers.peer.curve_keys import server_keys
from kvtier.tiers.peer.tier import PeerTier
from tests.conftest import collect, config, fill, holds, make_keys, settle_lookup, wait_for
from tests.tiers.peer_node import PeerNode
from tests.tiers.s3_server import free_port


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """server, alice (allowed: her public key is in clients/) and mallory (not allowed)."""
    root = tmp_path_factory.mktemp("curve")
    for name in ("server", "alice", "mallory"):
        assert main(["peer", "keygen", "--out", str(root), "--name", name]) == 0
    (root / "clients").mkdir()
    shutil.copy(root / "alice.public", root / "clients" / "alice.public")
    return root


@pytest.fixture(scope="module")
def node(keys_dir: Path) -> Iterator[PeerNode]:
    served = PeerNode(0, "--store", "4", "--curve", str(keys_dir)).start()
    yield served
    served.kill()


@pytest.fixture
def region(identity) -> HostRegion:
    return HostRegion(8, identity.layout.chunk_bytes)


def curve(keys_dir: Path, client: str, server: str = "server") -> dict[str, object]:
    return {
        "curve_secret_key_file": str(keys_dir / f"{client}.secret"),
        "curve_server_key_file": str(keys_dir / f"{server}.public"),
        "timeout_s": 0.5,
    }


def test_keygen_writes_a_private_secret_and_refuses_to_overwrite(keys_dir):
    assert stat.S_IMODE((keys_dir / "alice.secret").stat().st_mode) == 0o600
    assert len((keys_dir / "alice.public").read_bytes().strip()) == 40
    with pytest.raises(SystemExit) as refused:
        main(["peer", "keygen", "--out", str(keys_dir), "--name", "alice"])
    assert refused.value.code == 2


def test_an_allowed_client_fetches_byte_identical_chunks(node, keys_dir, identity, region):
    keys = make_keys(identity, 4)
    tier = node.tier(region, identity, **curve(keys_dir, "alice"))
    try:
        assert all(settle_lookup(tier, key) is HIT for key in keys)
        tier.submit_load(TransferJob(1, tuple(keys), (0, 1, 2, 3)))
        assert collect(tier, [1])[1].succeeded == frozenset(keys)
        assert all(holds(region, slot, key) for slot, key in enumerate(keys))
    finally:
        tier.close()


@pytest.mark.parametrize(
    "who",
    ["key not on the allow-list", "no CURVE at all", "wrong server key"],
)
def test_unauthenticated_clients_are_refused(node, keys_dir, identity, region, who):
    options = {
        "key not on the allow-list": curve(keys_dir, "mallory"),
        "no CURVE at all": {"timeout_s": 0.5},
        "wrong server key": curve(keys_dir, "alice", server="mallory"),
    }[who]
    tier = node.tier(region, identity, **options)
    try:
        key = make_keys(identity, 1)[0]
        assert settle_lookup(tier, key) is MISS
        tier.submit_load(TransferJob(1, (key,), (0,)))
        assert collect(tier, [1])[1].succeeded == frozenset()
        assert tier.stats()["peer_failures"] >= 1
    finally:
        tier.close()


def test_curve_options_come_in_pairs_and_need_keys(tmp_path):
    with pytest.raises(ConfigError, match="curve_client_keys_dir"):
        ServeConfig(port=1, curve_secret_key_file="x")
    main(["peer", "keygen", "--out", str(tmp_path / "keys"), "--name", "s"])
    (tmp_path / "nobody").mkdir()
    with pytest.raises(ConfigError, match=r"no \*\.public key files"):
        server_keys(str(tmp_path / "keys" / "s.secret"), str(tmp_path / "nobody"))
    (tmp_path / "bad.secret").write_text("not a key\n")
    with pytest.raises(ConfigError, match="Z85 CURVE key"):
        server_keys(str(tmp_path / "bad.secret"), str(tmp_path / "keys"))
    with pytest.raises(ConfigError, match="cannot read"):
        server_keys(str(tmp_path / "missing.secret"), str(tmp_path / "keys"))


def test_the_server_binds_loopback_unless_told_otherwise():
    assert ServeConfig(port=1).host == "127.0.0.1"


@pytest.mark.parametrize("blocks_per_chunk", [4, 32], ids=["1MiB", "8MiB"])
def test_curve_carries_real_chunk_sizes_both_ways(keys_dir, blocks_per_chunk):
    """CURVE sends each frame 33 bytes longer: a whole chunk's frame must pass the size limit."""
    layout = KVLayout(
        num_layers=4,
        num_kv_heads=8,
        head_dim=128,
        dtype="float16",
        block_size=16,
        blocks_per_chunk=blocks_per_chunk,
    )
    assert layout.chunk_bytes == blocks_per_chunk << 18  # 1 MiB or 8 MiB
    identity = CacheIdentity(model="test/model", revision="r1", layout=layout)
    keys, port = make_keys(identity, 3), free_port()
    serve = {
        "port": port,
        "accept_stores": True,
        "curve_secret_key_file": str(keys_dir / "server.secret"),
        "curve_client_keys_dir": str(keys_dir / "clients"),
    }
    with TieringManager(config(4, layout, serve=serve), identity) as server:
        plan = server.prepare_store(keys[:2])
        assert plan is not None
        for key, slot in zip(plan.keys, plan.slots):
            fill(server.region, slot, key)
        server.complete_store(plan.keys)
        region = HostRegion(4, layout.chunk_bytes)
        options = {**curve(keys_dir, "alice"), "timeout_s": 10.0}
        tier = PeerTier(P2PTierConfig(host="127.0.0.1", port=port, **options), region, identity)
        try:
            assert [settle_lookup(tier, key) for key in keys[:2]] == [HIT, HIT]
            tier.submit_load(TransferJob(1, tuple(keys[:2]), (0, 1)))
            assert collect(tier, [1], timeout=60)[1].succeeded == frozenset(keys[:2])
            assert holds(region, 0, keys[0]) and holds(region, 1, keys[1])
            fill(region, 2, keys[2])
            tier.submit_store(TransferJob(2, (keys[2],), (2,)))
            assert collect(tier, [2], timeout=60)[2].ok, "the server took a whole chunk"
        finally:
            tier.close()
        wait_for(lambda: server.lookup(keys[2:]) == 1, timeout=30)
        slot = server.prepare_load(keys[2:])[0]
        assert holds(server.region, slot, keys[2])
        server.complete_load(keys[2:])


def test_stores_beyond_loopback_without_curve_are_refused_unless_forced(keys_dir):
    exposed = {"cpu_bytes_to_use": 1 << 20, "serve": {"port": 5710, "host": "0.0.0.0"}}
    exposed["serve"]["accept_stores"] = True  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"^serve\.accept_stores: refused on 0\.0\.0\.0"):
        TieringConfig.from_dict(exposed)
    with pytest.raises(ConfigError, match="allow_insecure_stores"):
        ServeConfig(port=1, host="10.0.0.1", accept_stores=True)
    forced = ServeConfig(port=1, host="0.0.0.0", accept_stores=True, allow_insecure_stores=True)
    assert forced.accept_stores and not forced.loopback
    assert ServeConfig(port=1, host="::1", accept_stores=True).loopback
    secured = ServeConfig(
        port=1,
        host="0.0.0.0",
        accept_stores=True,
        curve_secret_key_file=str(keys_dir / "server.secret"),
        curve_client_keys_dir=str(keys_dir / "clients"),
    )
    assert secured.accept_stores


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_server_beyond_loopback_without_curve_warns_loudly(identity, caplog, host):
    serve = {"port": free_port(), "host": host}
    with caplog.at_level(logging.WARNING, logger="kvtier.tiers.peer.server"):
        TieringManager(config(4, serve=serve), identity).close()
    warned = [r for r in caplog.records if "WITHOUT CURVE" in r.getMessage()]
    assert len(warned) == (host == "0.0.0.0")
