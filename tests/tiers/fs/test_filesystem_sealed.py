"""Sealed chunk files (issue 25, finding 1): a writer of ``root_dir`` cannot choose the KV served.

The attacker (``tests/tiers/attacker.py``, a plain script that imports nothing of kvtier's)
rewrites every chunk file with bytes of its choosing from public information only: the identity
digest is the directory name, the key the file name. Without an integrity key kvtier serves its
bytes (the finding, kept as the control); with one, each planted chunk is a miss counted under
its reason, and nothing the attacker wrote is served. Then: a wrong key, rotation both ways,
chunks of the old format, encryption at rest, and key files that are not private.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier import CacheIdentity, ChunkKey, TieringManager
from kvtier.errors import ConfigError, TierError
from kvtier.tiers.fs.files import O_DIRECT
from kvtier.tiers.shared.codec import HEADER_BYTES
from tests.conftest import chunk_pattern, config, make_keys, read, settle, store
from tests.tiers.sealing_keys import KEY_A, KEY_B, PLANTED, attack, key_file, key_id

pytest.importorskip("cryptography")
pytestmark = pytest.mark.usefixtures("fs_io")


def tier(root: Path, key: str | None = None, **options: object) -> dict[str, object]:
    entry = {"type": "fs", "root_dir": str(root), "name": "disk", **options}
    return entry if key is None else {**entry, "integrity_key_file": key}


def manager(
    root: Path, identity: CacheIdentity, key: str | None = None, **options: object
) -> TieringManager:
    return TieringManager(config(8, secondary_tiers=[tier(root, key, **options)]), identity)


def write(
    root: Path,
    identity: CacheIdentity,
    keys: list[ChunkKey],
    key: str | None = None,
    **options: object,
) -> None:
    with manager(root, identity, key, **options) as writer:
        store(writer, keys)
        assert writer.wait_idle(timeout=10)


def files(root: Path, identity: CacheIdentity) -> list[Path]:
    return sorted((root / identity.hexdigest).glob("??/??/*"))


def served(reader: TieringManager, keys: list[ChunkKey]) -> list[bool]:
    """Per key alone: whether a lookup serves it (settled: promotions done or failed)."""
    return [settle(reader, [key]) == 1 for key in keys]


def integrity(reader: TieringManager) -> dict[str, int]:
    stats = reader.stats()["tiers"]["disk"]
    return {k.split(".", 1)[1]: v for k, v in stats.items() if k.startswith("integrity.")}


def failures(reader: TieringManager) -> int:
    telemetry = reader.metrics.telemetry
    return int(telemetry.get("kvtier_tier_integrity_failures_total", tier="disk"))


def test_without_a_key_the_attacker_chooses_the_kv_served(tmp_path, identity):
    """The control (mode "none", as documented): the attacker's bytes are served."""
    keys = make_keys(identity, 4)
    write(tmp_path, identity, keys)
    assert len(attack("fs", str(tmp_path), "v1")) == 4
    with manager(tmp_path, identity) as reader:
        assert settle(reader, keys) == 4
        slots = reader.prepare_load(keys)
        assert all(bytes(reader.region.view(s)).startswith(PLANTED) for s in slots)
        reader.complete_load(keys)
        assert integrity(reader) == {}


@pytest.mark.parametrize("encrypt", [False, True])
@pytest.mark.parametrize("mode, reason", [("v1", "unkeyed"), ("reuse", "forged"), ("v2", "forged")])
def test_with_a_key_every_planted_chunk_is_a_miss(tmp_path, identity, mode, reason, encrypt):
    secret = key_file(tmp_path / "chunks.key", KEY_A)
    keys = make_keys(identity, 4)
    root = tmp_path / "cache"
    write(root, identity, keys, secret, encrypt=encrypt)
    assert len(attack("fs", str(root), mode)) == 4
    with manager(root, identity, secret, encrypt=encrypt) as reader:
        assert served(reader, keys) == [False] * 4
        assert integrity(reader) == {reason: 4}
        assert failures(reader) == 4
    assert files(root, identity) == []  # deleted: the next store writes the chunk anew


def test_a_wrong_key_is_a_miss_never_wrong_bytes(tmp_path, identity):
    keys = make_keys(identity, 4)
    root = tmp_path / "cache"
    write(root, identity, keys, key_file(tmp_path / "a.key", KEY_A))
    with manager(root, identity, key_file(tmp_path / "b.key", KEY_B)) as reader:
        assert served(reader, keys) == [False] * 4
        assert integrity(reader) == {"unknown_key": 4}


def test_rotation_serves_old_chunks_with_the_previous_key_and_seals_with_the_new(
    tmp_path, identity
):
    old, new = make_keys(identity, 4), make_keys(identity, 4, seed=1)
    root = tmp_path / "cache"
    write(root, identity, old, key_file(tmp_path / "a.key", KEY_A))
    rotated = key_file(tmp_path / "ba.key", KEY_B, KEY_A)
    with manager(root, identity, rotated) as reader:
        assert served(reader, old) == [True] * 4 and read(reader, old)
        store(reader, new)
        assert reader.wait_idle(timeout=10)
    ids = {path.name: path.read_bytes()[88:96] for path in files(root, identity)}
    assert {ids[k.hex()] for k in new} == {key_id(KEY_B)}
    assert {ids[k.hex()] for k in old} == {key_id(KEY_A)}
    with manager(root, identity, key_file(tmp_path / "ab.key", KEY_A, KEY_B)) as rolled_back:
        assert served(rolled_back, old + new) == [True] * 8 and read(rolled_back, old + new)
    with manager(root, identity, key_file(tmp_path / "b.key", KEY_B)) as only_new:
        assert served(only_new, new) == [True] * 4 and read(only_new, new)
        assert served(only_new, old) == [False] * 4
        assert integrity(only_new) == {"unknown_key": 4}


def test_chunks_written_without_a_key_miss_once_one_is_set_and_are_written_anew(tmp_path, identity):
    keys = make_keys(identity, 4)
    root, secret = tmp_path / "cache", key_file(tmp_path / "a.key", KEY_A)
    write(root, identity, keys)
    with manager(root, identity, secret) as reader:
        assert served(reader, keys) == [False] * 4
        assert integrity(reader) == {"unkeyed": 4}
        store(reader, keys)  # recomputed, stored again: sealed
        assert reader.wait_idle(timeout=10)
    with manager(root, identity, secret) as again:
        assert served(again, keys) == [True] * 4 and read(again, keys)
        assert integrity(again) == {}


@pytest.mark.parametrize("o_direct", ["off", "on"])
@pytest.mark.parametrize("encrypt", [False, True])
def test_encryption_leaves_no_plaintext_at_rest_and_round_trips(
    tmp_path, identity, encrypt, o_direct
):
    """Through the page cache and with O_DIRECT (the ciphertext from an aligned scratch buffer)."""
    if o_direct == "on" and not O_DIRECT:
        pytest.skip("no O_DIRECT on this platform")
    keys = make_keys(identity, 4)
    root, secret = tmp_path / "cache", key_file(tmp_path / "a.key", KEY_A)
    try:
        write(root, identity, keys, secret, encrypt=encrypt, o_direct=o_direct)
    except TierError as exc:
        pytest.skip(f"this file system refuses O_DIRECT: {exc}")
    size = identity.layout.chunk_bytes
    for path in files(root, identity):
        data, plain = path.read_bytes(), chunk_pattern(bytes.fromhex(path.name), size)
        assert len(data) == HEADER_BYTES + size
        windows = [plain[i : i + 32] for i in range(0, size, size // 8)]
        assert any(w in data for w in windows) is not encrypt
    with manager(root, identity, secret, encrypt=encrypt, o_direct=o_direct) as reader:
        assert served(reader, keys) == [True] * 4 and read(reader, keys)
    with manager(root, identity, secret, encrypt=not encrypt) as other:  # the header says which
        assert served(other, keys) == [True] * 4 and read(other, keys)


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_a_key_file_others_may_read_stops_the_start(tmp_path, identity, mode):
    secret = key_file(tmp_path / "a.key", KEY_A)
    Path(secret).chmod(mode)
    with pytest.raises(
        ConfigError, match=r"^secondary_tiers\[0\]\.integrity_key_file: .*chmod 600"
    ):
        manager(tmp_path / "cache", identity, secret)


def test_the_top_level_key_seals_every_tier_and_encrypt_needs_one(tmp_path, identity):
    keys = make_keys(identity, 2)
    root, secret = tmp_path / "cache", key_file(tmp_path / "a.key", KEY_A)
    entry = tier(root, encrypt=True)
    with TieringManager(
        config(8, secondary_tiers=[entry], integrity_key_file=secret), identity
    ) as m:
        store(m, keys)
        assert m.wait_idle(timeout=10)
    assert all(path.read_bytes()[8:12] == b"\x02\x00\x03\x00" for path in files(root, identity))
    with pytest.raises(ConfigError, match=r"^secondary_tiers\[0\]\.encrypt: needs integrity_key"):
        config(8, secondary_tiers=[entry])
