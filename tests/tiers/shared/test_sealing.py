"""Sealed chunks (``codec`` version 2) and integrity key files: what verifies, what never does."""

from __future__ import annotations

import hmac
import os
from pathlib import Path

import pytest

from kvtier.errors import ConfigError, IntegrityError
from kvtier.tiers.shared import codec
from kvtier.tiers.shared.integrity_key import read_integrity_keys
from kvtier.tiers.shared.sealing import (
    DECRYPT_PIECE,
    ChecksumSealer,
    KeyedSealer,
    key_id,
    make_sealer,
)

pytest.importorskip("cryptography")

IDENTITY, KEY = bytes(range(32)), bytes(range(32, 64))
OLD, NEW = bytes([1]) * 32, bytes([2]) * 32


def sealed(sealer, payload: bytes) -> tuple[bytearray, bytearray]:
    """(header, body as stored) of ``payload``."""
    out = memoryview(bytearray(len(payload)))
    header = bytearray(sealer.seal(IDENTITY, KEY, payload, out))
    return header, bytearray(out if sealer.encrypts else payload)


def opened(sealer, header, body, key: bytes = KEY) -> bytes:
    sealer.open(header, body, IDENTITY, key)
    return bytes(body)


def reason(sealer, header, body, key: bytes = KEY) -> str:
    with pytest.raises(IntegrityError) as failed:
        sealer.open(header, body, IDENTITY, key)
    return failed.value.reason


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_sealed_chunk_round_trips_and_any_changed_byte_is_a_miss(encrypt):
    payload = os.urandom(64 << 10)
    sealer = KeyedSealer((NEW,), encrypt)
    header, body = sealed(sealer, payload)
    assert (payload in bytes(body)) is not encrypt
    assert opened(sealer, bytearray(header), bytearray(body)) == payload
    for offset in (10, 20, 60, 82, 90, 100, 130):  # algorithm, identity, key, length, id, salt, tag
        changed = bytearray(header)
        changed[offset] ^= 0x01
        assert reason(sealer, changed, bytearray(body)) in {
            "forged",
            "unknown_key",
            "version",
            "length",
        }
    for offset in (0, 4096, len(body) - 1):
        changed = bytearray(body)
        changed[offset] ^= 0x80
        assert reason(sealer, bytearray(header), changed) == "forged"


@pytest.mark.parametrize(
    "size", [1, DECRYPT_PIECE - 1, DECRYPT_PIECE + 1, 3 * DECRYPT_PIECE + 5, 2 << 20]
)
def test_an_encrypted_payload_of_any_length_is_decrypted_where_it_lies(size):
    """Decrypted a piece at a time (cryptography 51 refuses an output overlapping the input):
    every piece lands in its place, the last one short."""
    payload = os.urandom(size)
    sealer = KeyedSealer((NEW,), True)
    header, body = sealed(sealer, payload)
    assert opened(sealer, header, body) == payload
    body[-1] ^= 0x01
    assert reason(sealer, header, body) == "forged"


def test_the_tag_is_standard_aes_gcm_over_the_header_and_the_payload():
    """Any AES-GCM implementation verifies a chunk: the construction is the one documented."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    payload = os.urandom(10_000)
    header, _ = sealed(KeyedSealer((NEW,), False), payload)
    fields = codec.decode_sealed(header)
    subkey = hmac.digest(NEW, b"kvtier chunk v2 aes-256-gcm\0" + fields.salt, "sha256")
    aad = bytes(header[: codec.SEALED_AAD_BYTES]) + payload
    assert AESGCM(subkey).encrypt(bytes(12), b"", aad) == fields.tag
    assert fields.key_id == key_id(NEW)


def test_each_sealing_draws_a_new_salt():
    payload = b"x" * 4096
    sealer = KeyedSealer((NEW,), True)
    salts = {codec.decode_sealed(sealed(sealer, payload)[0]).salt for _ in range(50)}
    assert len(salts) == 50


def test_a_writer_without_the_key_cannot_make_a_chunk_that_verifies():
    """The unkeyed format, a copied header over new bytes, and a header sealed under another
    key: all misses, each with its reason."""
    reader = KeyedSealer((NEW,), False)
    planted = b"planted" * 1000
    v1 = ChecksumSealer().seal(IDENTITY, KEY, planted)
    assert reason(reader, v1, bytearray(planted)) == "unkeyed"
    header, _ = sealed(reader, b"genuine" * 1000)
    assert reason(reader, header, bytearray(planted)) == "forged"
    stranger, _ = sealed(KeyedSealer((os.urandom(32),), False), planted)
    assert reason(reader, stranger, bytearray(planted)) == "unknown_key"


def test_a_valid_chunk_under_another_name_is_refused():
    reader = KeyedSealer((NEW,), False)
    header, body = sealed(reader, b"a" * 4096)
    assert reason(reader, header, body, key=bytes(32)) == "key"


@pytest.mark.parametrize("encrypt", [False, True])
def test_rotation_opens_chunks_of_every_key_in_the_file_and_seals_with_the_first(encrypt):
    payload = os.urandom(8192)
    old_header, old_body = sealed(KeyedSealer((OLD,), encrypt), payload)
    rotated = KeyedSealer((NEW, OLD), encrypt)
    assert opened(rotated, old_header, bytearray(old_body)) == payload
    new_header, new_body = sealed(rotated, payload)
    assert codec.decode_sealed(new_header).key_id == key_id(NEW)
    rolled_back = KeyedSealer((OLD, NEW), encrypt)
    assert opened(rolled_back, new_header, bytearray(new_body)) == payload
    assert reason(KeyedSealer((OLD,), encrypt), new_header, bytearray(new_body)) == "unknown_key"


def test_a_reader_without_a_key_misses_sealed_chunks_and_a_plain_one_takes_no_encrypted():
    header, body = sealed(KeyedSealer((NEW,), True), b"p" * 4096)
    assert reason(ChecksumSealer(), header, body) == "keyed"
    assert reason(KeyedSealer((NEW,), False, decrypts=False), header, bytearray(body)) == "version"


def test_encrypt_without_a_key_is_refused():
    with pytest.raises(ConfigError, match=r"^encrypt: needs integrity_key_file"):
        make_sealer(None, encrypt=True)
    assert not make_sealer(None).keyed


def key_file(path: Path, *keys: bytes, mode: int = 0o600, text: str = "") -> str:
    path.write_text(text or "# kvtier\n\n" + "".join(k.hex() + "\n" for k in keys))
    path.chmod(mode)
    return str(path)


def test_a_key_file_holds_keys_current_first(tmp_path):
    path = key_file(tmp_path / "k", NEW, OLD)
    assert read_integrity_keys(path) == (NEW, OLD)
    assert make_sealer(path, encrypt=True).encrypts


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602])
def test_a_key_file_others_may_read_or_change_is_refused(tmp_path, mode):
    path = key_file(tmp_path / "k", NEW, mode=mode)
    with pytest.raises(ConfigError, match=rf"^integrity_key_file: .* mode 0{mode:o}.*chmod 600"):
        read_integrity_keys(path)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("not hex at all\n", "line 1: expected 64 hex digits"),
        ("abcd\n", "line 1: expected 64 hex digits"),
        ("# only a comment\n", "holds 0 keys"),
        ("".join(os.urandom(32).hex() + "\n" for _ in range(17)), "holds 17 keys"),
    ],
)
def test_a_key_file_that_holds_no_proper_key_is_refused_without_echoing_it(tmp_path, text, problem):
    path = key_file(tmp_path / "k", text=text)
    with pytest.raises(ConfigError, match=problem) as refused:
        read_integrity_keys(path)
    assert "not hex" not in str(refused.value)


def test_a_missing_key_file_a_directory_and_a_fifo_are_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo", 0o600)
    (tmp_path / "dir").mkdir(mode=0o700)
    for name, problem in [("absent", "cannot read"), ("dir", "not a regular"), ("fifo", "not a")]:
        with pytest.raises(ConfigError, match=f"^integrity_key_file: .*{problem}"):
            read_integrity_keys(str(tmp_path / name))


def test_a_key_file_of_another_user_is_refused(tmp_path, monkeypatch):
    path = key_file(tmp_path / "k", NEW)
    if os.geteuid() == 0:
        os.chown(path, 4242, -1)
    else:  # our own file, as seen by another user
        monkeypatch.setattr(os, "geteuid", lambda: os.stat(path).st_uid + 4242)
    with pytest.raises(ConfigError, match="belongs to uid"):
        read_integrity_keys(path)
