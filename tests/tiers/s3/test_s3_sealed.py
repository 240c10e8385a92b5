"""Sealed objects (issue 25, finding 1): whoever can write the bucket cannot choose the KV served.

The attacker (``tests/tiers/attacker.py``, a plain script that imports nothing of kvtier's)
lists the bucket and rewrites every chunk object over plain HTTP, from public information only
(the identity digest and key are in the object's name). Against the tests' real S3 server.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier import CacheIdentity, ChunkKey, TieringManager
from kvtier.region import HostRegion
from kvtier.tiers.base import JobResult, SecondaryTier, TransferJob
from kvtier.tiers.shared.codec import HEADER_BYTES
from tests.conftest import chunk_pattern, collect, config, fill, holds, make_keys, settle
from tests.tiers.s3_server import ACCESS_KEY, SECRET_KEY, MotoServer
from tests.tiers.sealing_keys import KEY_A, KEY_B, PLANTED, attack, key_file

pytest.importorskip("obstore")
pytest.importorskip("cryptography")

BUCKET = "kvtier"
#: The bucket's credentials: the attacker can write the bucket.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}


@pytest.fixture
def region(identity: CacheIdentity) -> HostRegion:
    return HostRegion(8, identity.layout.chunk_bytes)


@pytest.fixture
def prefix() -> str:
    return f"sealed-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def open_tiers() -> Iterator[list[SecondaryTier]]:
    made: list[SecondaryTier] = []
    yield made
    for tier in made:
        tier.close()


class Bucket:
    """Tiers over one prefix of the test server's bucket, and the attacker's view of it."""

    def __init__(self, server: MotoServer, prefix: str, region: HostRegion, identity, made):
        self.server, self.prefix, self.region, self.identity = server, prefix, region, identity
        self._made, self._jobs = made, iter(range(1, 1 << 30))

    def tier(self, key: str | None = None, **options: object) -> SecondaryTier:
        if key is not None:
            options["integrity_key_file"] = key
        tier = self.server.tier(BUCKET, self.region, self.identity, prefix=self.prefix, **options)
        self._made.append(tier)
        return tier

    def store(self, tier: SecondaryTier, keys: list[ChunkKey]) -> None:
        for slot, key in enumerate(keys):
            fill(self.region, slot, key)
        job = next(self._jobs)
        tier.submit_store(TransferJob(job, tuple(keys), tuple(range(len(keys)))))
        assert collect(tier, [job])[job].ok

    def load(self, tier: SecondaryTier, keys: list[ChunkKey]) -> JobResult:
        for slot in range(len(keys)):
            self.region.view(slot)[:] = bytes(self.region.slot_bytes)
        job = next(self._jobs)
        tier.submit_load(TransferJob(job, tuple(keys), tuple(range(len(keys)))))
        return collect(tier, [job])[job]

    def raw(self, key: ChunkKey) -> bytes:
        """The object as the bucket holds it (another client, straight on the bucket)."""
        boto3 = pytest.importorskip("boto3")
        s3 = boto3.client(
            "s3", endpoint_url=self.server.endpoint, region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        )  # fmt: skip
        name = f"{self.prefix}/{self.identity.hexdigest}/{key.hex()}"
        return bytes(s3.get_object(Bucket=BUCKET, Key=name)["Body"].read())

    def attack(self, mode: str) -> list[str]:
        return attack("s3", self.server.endpoint, BUCKET, self.prefix, mode, env=CREDENTIALS)


@pytest.fixture
def bucket(s3_server, prefix, region, identity, open_tiers) -> Bucket:
    return Bucket(s3_server, prefix, region, identity, open_tiers)


def integrity(tier: SecondaryTier) -> dict[str, int]:
    stats = tier.stats()
    return {k.split(".", 1)[1]: v for k, v in stats.items() if k.startswith("integrity.")}


def test_without_a_key_the_attacker_chooses_the_kv_loaded(bucket, identity):
    """The control (mode "none", as documented): the attacker's bytes load as the chunk's."""
    keys = make_keys(identity, 4)
    bucket.store(bucket.tier(), keys)
    assert len(bucket.attack("v1")) == 4
    result = bucket.load(bucket.tier(), keys)
    assert result.succeeded == set(keys)
    assert all(bytes(bucket.region.view(s)).startswith(PLANTED) for s in range(4))


@pytest.mark.parametrize("encrypt", [False, True])
@pytest.mark.parametrize("mode, reason", [("v1", "unkeyed"), ("reuse", "forged"), ("v2", "forged")])
def test_with_a_key_every_planted_object_is_a_miss(
    bucket, identity, tmp_path, mode, reason, encrypt
):
    secret = key_file(tmp_path / "chunks.key", KEY_A)
    keys = make_keys(identity, 4)
    bucket.store(bucket.tier(secret, encrypt=encrypt), keys)
    assert len(bucket.attack(mode)) == 4
    reader = bucket.tier(secret, encrypt=encrypt)
    result = bucket.load(reader, keys)
    assert result.succeeded == frozenset() and result.integrity_failed == set(keys)
    assert integrity(reader) == {reason: 4}


def test_a_wrong_key_is_a_miss_never_wrong_bytes(bucket, identity, tmp_path):
    keys = make_keys(identity, 4)
    bucket.store(bucket.tier(key_file(tmp_path / "a.key", KEY_A)), keys)
    reader = bucket.tier(key_file(tmp_path / "b.key", KEY_B))
    result = bucket.load(reader, keys)
    assert result.succeeded == frozenset() and result.integrity_failed == set(keys)
    assert integrity(reader) == {"unknown_key": 4}


def test_rotation_both_ways(bucket, identity, tmp_path):
    old, new = make_keys(identity, 2), make_keys(identity, 2, seed=1)
    bucket.store(bucket.tier(key_file(tmp_path / "a.key", KEY_A)), old)
    bucket.store(bucket.tier(key_file(tmp_path / "ba.key", KEY_B, KEY_A)), new)
    rolled_back = bucket.tier(key_file(tmp_path / "ab.key", KEY_A, KEY_B))
    assert bucket.load(rolled_back, old + new).succeeded == set(old + new)
    assert all(holds(bucket.region, slot, key) for slot, key in enumerate(old + new))
    only_new = bucket.tier(key_file(tmp_path / "b.key", KEY_B))
    result = bucket.load(only_new, old + new)
    assert result.succeeded == set(new) and result.integrity_failed == set(old)


def test_encryption_leaves_no_plaintext_in_the_bucket_and_round_trips(bucket, identity, tmp_path):
    secret = key_file(tmp_path / "a.key", KEY_A)
    keys = make_keys(identity, 4)
    bucket.store(bucket.tier(secret, encrypt=True), keys)
    size = identity.layout.chunk_bytes
    for key in keys:
        stored, plain = bucket.raw(key), chunk_pattern(key, size)
        assert len(stored) == HEADER_BYTES + size
        assert not any(plain[i : i + 32] in stored for i in range(0, size, size // 8))
    reader = bucket.tier(secret, encrypt=True)
    assert bucket.load(reader, keys).succeeded == set(keys)
    assert all(holds(bucket.region, slot, key) for slot, key in enumerate(keys))


def test_through_the_manager_nothing_planted_is_served(s3_server, prefix, identity, tmp_path):
    """The finding's sequence: store, restart, rewritten objects; served: none of them."""
    secret = key_file(tmp_path / "a.key", KEY_A)
    entry = {
        "type": "obj", "bucket": BUCKET, "endpoint_override": s3_server.endpoint,
        "prefix": prefix, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY, "name": "bucket",
    }  # fmt: skip
    keys = make_keys(identity, 4)
    sealed = config(8, secondary_tiers=[entry], integrity_key_file=secret)
    with TieringManager(sealed, identity) as writer:
        plan = writer.prepare_store(keys)
        assert plan is not None
        for key, slot in zip(plan.keys, plan.slots, strict=True):
            fill(writer.region, slot, key)
        writer.complete_store(plan.keys)
        assert writer.wait_idle(20)
    assert len(attack("s3", s3_server.endpoint, BUCKET, prefix, "reuse", env=CREDENTIALS)) == 4
    with TieringManager(sealed, identity) as reader:
        assert [settle(reader, [key]) for key in keys] == [0] * 4
        assert integrity(reader.runtime.tiers[0]) == {"forged": 4}
    assert Path(secret).stat().st_mode & 0o077 == 0
