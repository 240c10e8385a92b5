"""The object store tier against a real S3-protocol server: lookups, verification, errors.

Objects are corrupted with a second, independent client (obstore straight on the bucket), the way
a broken writer or another deployment would leave them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from kvtier import CacheIdentity, KVLayout, TieringConfig, TieringManager
from kvtier.config.describe import describe_tier
from kvtier.errors import ConfigError, TierError
from kvtier.region import HostRegion
from kvtier.tiers.base import HIT, MISS, RETRY, SecondaryTier, TransferJob
from kvtier.tiers.shared import codec
from tests.conftest import collect, config, fill, holds, make_keys, settle_lookup
from tests.tiers.s3.s3_workload import settle
from tests.tiers.s3_server import ACCESS_KEY, SECRET_KEY, MotoServer

obstore = pytest.importorskip("obstore")
from obstore.store import S3Store  # noqa: E402

BUCKET = "kvtier"


@pytest.fixture
def region(identity: CacheIdentity) -> HostRegion:
    return HostRegion(16, identity.layout.chunk_bytes)


@pytest.fixture
def tiers(s3_server: MotoServer) -> Iterator[list[SecondaryTier]]:
    made: list[SecondaryTier] = []
    yield made
    for tier in made:
        tier.close()


def raw_store(server: MotoServer) -> S3Store:
    return S3Store(
        BUCKET,
        endpoint=server.endpoint,
        region="us-east-1",
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        client_options={"allow_http": True},
    )


def object_name(prefix: str, identity: CacheIdentity, key: bytes) -> str:
    return f"{prefix}/{identity.hexdigest}/{key.hex()}"


def store_one(tier: SecondaryTier, region: HostRegion, key: bytes, job_id: int = 1) -> None:
    fill(region, 0, key)
    tier.submit_store(TransferJob(job_id, (key,), (0,)))  # type: ignore[arg-type]
    assert collect(tier, [job_id])[job_id].ok


def test_objects_are_named_by_prefix_identity_and_key(s3_server, tiers, region, identity):
    """The layout on the bucket is the documented one, with the identity described beside it."""
    tiers.append(s3_server.tier(BUCKET, region, identity, prefix="named"))
    (key,) = make_keys(identity, 1, seed=10)
    store_one(tiers[0], region, key)
    raw = raw_store(s3_server)
    body = bytes(obstore.get(raw, object_name("named", identity, key)).bytes())
    assert len(body) == codec.HEADER_BYTES + region.slot_bytes
    codec.verify(body[: codec.HEADER_BYTES], body[codec.HEADER_BYTES :], identity.digest, key)
    described = obstore.get(raw, f"named/{identity.hexdigest}/identity.json").bytes()
    assert b'"model": "test/model"' in bytes(described)


CORRUPTIONS = ["checksum", "identity", "key", "length", "longer", "magic"]


def corrupt(body: bytes, kind: str, identity: CacheIdentity, other_key: bytes) -> bytes:
    header, payload = body[: codec.HEADER_BYTES], body[codec.HEADER_BYTES :]
    if kind == "checksum":
        return header + payload[:-1] + bytes([payload[-1] ^ 1])
    if kind == "identity":
        return codec.encode_header(bytes(32), other_key, payload) + payload
    if kind == "key":
        return codec.encode_header(identity.digest, other_key, payload) + payload
    if kind == "length":
        return body[:-100]
    if kind == "longer":
        return body + bytes(100)
    return bytes(len(body))


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corrupted_or_foreign_objects_are_never_served(kind, s3_server, tiers, region, identity):
    """A bad object is reported as a failed key, counted by reason, and then looked up as MISS."""
    tiers.append(s3_server.tier(BUCKET, region, identity, prefix=f"bad-{kind}"))
    tier = tiers[0]
    key, other = make_keys(identity, 2, seed=11)
    store_one(tier, region, key)
    raw, name = raw_store(s3_server), object_name(f"bad-{kind}", identity, key)
    good = bytes(obstore.get(raw, name).bytes())
    obstore.put(raw, name, corrupt(good, kind, identity, other))
    tier.submit_load(TransferJob(2, (key,), (5,)))
    result = collect(tier, [2])[2]
    assert result.succeeded == frozenset() and result.failed == {key}
    assert result.integrity_failed == {key}
    reason = "length" if kind == "longer" else kind
    assert tier.stats()[f"integrity.{reason}"] == 1
    assert tier.lookup(key) is MISS


def test_manager_recomputes_rather_than_serving_a_corrupt_chunk(s3_server, identity):
    """Through the manager: the promotion fails, lookup settles on the chunks before it."""
    prefix = "bad-manager"
    tier_json = {
        "type": "obj",
        "bucket": BUCKET,
        "endpoint_override": s3_server.endpoint,
        "prefix": prefix,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
    }
    keys = make_keys(identity, 3, seed=12)
    with TieringManager(config(3, secondary_tiers=[tier_json]), identity) as writer:
        plan = writer.prepare_store(keys)
        assert plan is not None
        for key, slot in zip(plan.keys, plan.slots):
            fill(writer.region, slot, key)
        writer.complete_store(plan.keys)
        assert writer.wait_idle(20)
    raw, name = raw_store(s3_server), object_name(prefix, identity, keys[1])
    body = bytes(obstore.get(raw, name).bytes())
    obstore.put(raw, name, body[:-1] + bytes([body[-1] ^ 0xFF]))
    with TieringManager(config(3, secondary_tiers=[tier_json]), identity) as reader:
        ready = settle(reader, keys)
        assert ready == 1
        assert holds(reader.region, reader.prepare_load(keys[:1])[0], keys[0])
        reader.complete_load(keys[:1])


def test_hits_are_remembered_and_misses_expire(s3_server, tiers, region, identity):
    """Another instance's store becomes visible once the negative entry expires."""
    writer = s3_server.tier(BUCKET, region, identity, prefix="shared-view")
    reader = s3_server.tier(BUCKET, region, identity, prefix="shared-view", negative_ttl_s=0.2)
    tiers.extend([writer, reader])
    (key,) = make_keys(identity, 1, seed=13)
    assert reader.lookup(key) is RETRY
    assert settle_lookup(reader, key) is MISS
    store_one(writer, region, key)
    deadline = time.monotonic() + 10
    while settle_lookup(reader, key) is not HIT:
        assert time.monotonic() < deadline, "the negative entry never expired"
        time.sleep(0.02)
    probes = reader.stats()["probe_hit"]
    assert all(reader.lookup(key) is HIT for _ in range(50))
    assert reader.stats()["probe_hit"] == probes


def test_a_negative_ttl_of_zero_still_settles_a_lookup(s3_server, tiers, region, identity):
    """The probe's MISS reaches the lookup that waited for it; the next lookup asks again."""
    reader = s3_server.tier(BUCKET, region, identity, prefix="ttl-zero", negative_ttl_s=0)
    tiers.append(reader)
    (key,) = make_keys(identity, 1, seed=14)
    assert reader.lookup(key) is RETRY
    assert settle_lookup(reader, key) is MISS
    assert reader.lookup(key) is RETRY


def test_missing_bucket_is_a_clear_error(s3_server, region, identity):
    with pytest.raises(TierError, match="bucket 'no-such-bucket' does not exist"):
        s3_server.tier("no-such-bucket", region, identity)


def test_nested_store_config_form_builds_a_working_tier(s3_server, identity):
    """The ``store_config`` form (as some deployments write it) is the same tier."""
    nested = {
        "type": "obj",
        "prefix": "nested",
        "store_config": {
            "bucket": BUCKET,
            "endpoint_override": s3_server.endpoint,
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
        },
    }
    cfg = config(2, secondary_tiers=[nested])
    keys = make_keys(identity, 2, seed=14)
    with TieringManager(cfg, identity) as manager:
        plan = manager.prepare_store(keys)
        assert plan is not None
        for key, slot in zip(plan.keys, plan.slots):
            fill(manager.region, slot, key)
        manager.complete_store(plan.keys)
        assert manager.wait_idle(20)
        assert manager.stats()["tiers"]["obj"]["store_ok"] == 2


@pytest.fixture(scope="module")
def auth_server() -> Iterator[MotoServer]:
    """A moto server that checks credentials: no key is valid (no IAM users exist)."""
    server = MotoServer(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}).start()
    yield server
    server.stop()


def test_wrong_credentials_are_a_clear_error_that_never_shows_them(
    auth_server, region, identity, caplog
):
    caplog.set_level(logging.DEBUG)
    secret, access = "SeCrEt-must-not-leak-0123", "AKIAMUSTNOTLEAK0123"
    tier_config = auth_server.tier_config(BUCKET, access_key=access, secret_key=secret)
    with pytest.raises(TierError, match="rejected the credentials") as raised:
        auth_server.tier(BUCKET, region, identity, access_key=access, secret_key=secret)
    shown = [str(raised.value), repr(raised.value), caplog.text, repr(tier_config)]
    shown.append(describe_tier(tier_config))
    shown.append(
        repr(
            TieringConfig.from_dict(
                {
                    "cpu_bytes_to_use": 1 << 20,
                    "secondary_tiers": [
                        {"type": "obj", "bucket": "b", "access_key": access, "secret_key": secret}
                    ],
                }
            )
        )
    )
    assert not [text for text in shown if secret in text or access in text]


def test_a_bigger_layout_round_trips(s3_server, tiers):
    """Chunks of several MiB stream into the slot across many network buffers."""
    layout = KVLayout(
        num_layers=4,
        num_kv_heads=4,
        head_dim=128,
        dtype="float16",
        block_size=16,
        blocks_per_chunk=16,
    )
    identity = CacheIdentity(model="test/big", layout=layout)
    region = HostRegion(4, layout.chunk_bytes)
    assert layout.chunk_bytes >= 2 << 20
    tiers.append(s3_server.tier(BUCKET, region, identity, prefix="big"))
    keys = make_keys(identity, 2, seed=15)
    for slot, key in enumerate(keys):
        fill(region, slot, key)
    tiers[0].submit_store(TransferJob(1, tuple(keys), (0, 1)))
    assert collect(tiers[0], [1])[1].ok
    tiers[0].submit_load(TransferJob(2, tuple(keys), (2, 3)))
    assert collect(tiers[0], [2])[2].succeeded == frozenset(keys)
    assert holds(region, 2, keys[0]) and holds(region, 3, keys[1])
    assert tiers[0].stats()["bytes_read"] == 2 * (codec.HEADER_BYTES + layout.chunk_bytes)


@pytest.mark.parametrize("endpoint", ["minio:9000", "ftp://minio", "not a url"])
def test_an_endpoint_that_is_not_a_url_is_a_config_error(endpoint, s3_server, region, identity):
    with pytest.raises(ConfigError, match="endpoint_override"):
        s3_server.tier(BUCKET, region, identity, endpoint_override=endpoint)
