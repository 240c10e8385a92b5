"""``kvtier cache`` on an S3 prefix, against the tests' real S3-protocol server: objects laid
out as the obj tier lays them out, foreign objects beside them."""

from __future__ import annotations

import json
import uuid

import pytest

from kvtier.tiers.shared import codec
from tests.cache.cache_tree import PAYLOAD, chain, chunk_bytes, identity_doc, make_identity
from tests.cache.test_fs_commands import run
from tests.tiers.s3_server import ACCESS_KEY, SECRET_KEY, MotoServer

obstore = pytest.importorskip("obstore")
from obstore.store import S3Store  # noqa: E402

BUCKET = "kvtier"
CHUNK = codec.HEADER_BYTES + PAYLOAD


@pytest.fixture
def bucket(s3_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> S3Store:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    return S3Store(
        BUCKET,
        endpoint=s3_server.endpoint,
        region="us-east-1",
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        client_options={"allow_http": True},
    )


@pytest.fixture
def prefix() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


def put_chain(
    store: S3Store, prefix: str, model: str, n: int, drop: int | None = None
) -> list[str]:
    identity = make_identity(model)
    keys = chain(identity, n)
    obstore.put(store, f"{prefix}/{identity.hexdigest}/identity.json", identity_doc(identity))
    names = []
    for i, key in enumerate(keys):
        name = f"{prefix}/{identity.hexdigest}/{key.hex()}"
        names.append(name)
        if i != drop:
            parent = keys[i - 1] if i else None
            obstore.put(store, name, chunk_bytes(identity, key, parent, i))
    return names


FOREIGN = ["notes.txt", "0" * 64 + "/deeper/object", "zz/readme"]


def plant(store: S3Store, prefix: str, digest: str) -> list[str]:
    names = [f"{prefix}/{FOREIGN[0]}", f"{prefix}/{digest}/{FOREIGN[2]}", f"{prefix}/{FOREIGN[1]}"]
    for name in names:
        obstore.put(store, name, b"mine")
    return names


def exists(store: S3Store, name: str) -> bool:
    try:
        obstore.head(store, name)
    except FileNotFoundError:
        return False
    return True


def target(s3_server: MotoServer, prefix: str) -> list[str]:
    return [f"s3://{BUCKET}/{prefix}", "--endpoint", s3_server.endpoint]


def test_ls_and_du_on_a_bucket(s3_server, bucket, prefix, capsys):
    put_chain(bucket, prefix, "org/a", 3)
    names = put_chain(bucket, prefix, "org/b", 4, drop=1)
    foreign = plant(bucket, prefix, names[0].split("/")[1])
    code, out, err = run(capsys, "ls", *target(s3_server, prefix), "--json")
    assert code == 0
    doc = {i["model"]: i for i in json.loads(out)["identities"]}
    assert doc["org/a"]["chunks"] == 3 and doc["org/b"]["chunks"] == 3
    assert doc["org/a"]["bytes"] == 3 * CHUNK and doc["org/a"]["tokens_per_chunk"] == 256
    assert "foreign" in err
    code, out, _ = run(capsys, "du", *target(s3_server, prefix), "--json")
    doc = json.loads(out)
    assert doc["total"]["unreachable"] == 2 and doc["total"]["chunks"] == 6
    assert all(exists(bucket, name) for name in foreign)


def test_verify_and_repair_on_a_bucket(s3_server, bucket, prefix, capsys):
    names = put_chain(bucket, prefix, "org/a", 3)
    foreign = plant(bucket, prefix, names[0].split("/")[1])
    code, out, err = run(capsys, "verify", *target(s3_server, prefix), "--progress", "none")
    assert code == 0 and "3 good, 0 bad" in out, err
    body = bytes(obstore.get(bucket, names[1]).bytes())
    obstore.put(bucket, names[1], body[:-1] + bytes([body[-1] ^ 1]))
    obstore.put(bucket, names[2], bytes(obstore.get(bucket, names[2]).bytes())[:5000])
    code, out, _ = run(capsys, "verify", *target(s3_server, prefix), "--progress", "none")
    assert code == 1 and "(checksum=1, length=1)" in out
    code, out, _ = run(capsys, "verify", *target(s3_server, prefix), "--repair")
    assert code == 1 and "2 removed" in out
    assert (
        exists(bucket, names[0]) and not exists(bucket, names[1]) and not exists(bucket, names[2])
    )
    assert all(exists(bucket, name) for name in foreign)


def test_gc_on_a_bucket_bounds_keeps_heads_and_leaves_foreign_objects(
    s3_server, bucket, prefix, capsys
):
    a = put_chain(bucket, prefix, "org/a", 4)
    b = put_chain(bucket, prefix, "org/b", 4)
    foreign = plant(bucket, prefix, a[0].split("/")[1])
    code, out, _ = run(
        capsys, "gc", *target(s3_server, prefix), "--max-bytes", str(5 * CHUNK), "--dry-run"
    )
    assert code == 0 and "would delete 3" in out and all(exists(bucket, n) for n in a + b)
    code, out, _ = run(capsys, "gc", *target(s3_server, prefix), "--max-bytes", str(5 * CHUNK))
    assert code == 0 and "deleted 3" in out
    for names in (a, b):  # LastModified has whole seconds here: which identity goes is a tie
        held = [exists(bucket, n) for n in names]
        assert held == sorted(held, reverse=True)  # what is left of a chain is its head
    assert sum(exists(bucket, n) for n in a + b) == 5
    code, out, _ = run(capsys, "gc", *target(s3_server, prefix), "--model", "org/b")
    assert "purge=" in out and not any(exists(bucket, n) for n in b)
    assert all(exists(bucket, name) for name in foreign)


def test_a_bucket_that_does_not_exist_is_a_clear_error(s3_server, bucket, capsys):
    with pytest.raises(SystemExit) as stopped:
        run(capsys, "ls", "s3://no-such-bucket/x", "--endpoint", s3_server.endpoint)
    assert stopped.value.code == 2
    assert "does not exist" in capsys.readouterr().err


def test_an_object_over_the_read_bound_is_too_large_and_stays(s3_server, bucket, prefix, capsys):
    """Its listed size decides before any GET: a bucket writer cannot make verify allocate
    what the object claims; at the bound itself the object is read and judged."""
    names = put_chain(bucket, prefix, "org/a", 2)
    where = target(s3_server, prefix)
    code, out, err = run(capsys, "verify", *where, "--max-chunk-bytes", str(CHUNK - 1), "--repair")
    assert code == 1 and "verified 0 chunks" in out and "too_large=2" in err
    assert all(exists(bucket, name) for name in names)
    code, out, _ = run(capsys, "verify", *where, "--max-chunk-bytes", str(CHUNK))
    assert code == 0 and "2 good" in out


def test_a_huge_identity_json_is_read_no_further_than_its_bound(
    s3_server, bucket, prefix, capsys, monkeypatch
):
    """Anyone who can write the bucket chooses its size: ls reads 1 MiB and a piece of it,
    never the whole body, and counts it as a bad identity."""
    from kvtier.cache import s3_store

    digest = put_chain(bucket, prefix, "org/a", 1)[0].split("/")[1]
    obstore.put(bucket, f"{prefix}/{digest}/identity.json", b" " * (48 << 20))
    pulled: list[int] = []
    head_of = s3_store._head_of

    def counted(pieces, limit):
        def counting():
            for piece in pieces:
                pulled.append(len(memoryview(piece)))
                yield piece

        return head_of(counting(), limit)

    monkeypatch.setattr(s3_store, "_head_of", counted)
    _, _, err = run(capsys, "ls", *target(s3_server, prefix))
    assert "bad_identity=1" in err and "over 1048576 bytes" in err
    assert 1 << 20 < sum(pulled) < 8 << 20
