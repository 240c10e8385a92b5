"""Sealing a chunk: what proves, when it is read back, that kvtier wrote it.

Without an integrity key a chunk carries an xxh3 checksum (``codec`` version 1): it catches
damage, not a writer of the medium, who can compute it too. With one (``integrity_key_file``)
it is sealed (version 2) with AES-256-GCM under a key used for that chunk only: derived from
the integrity key and a random 32-byte salt (HMAC-SHA256), with a zero nonce (each derived key
seals one chunk). The tag covers the header (format, identity, chunk key, length, key id,
salt) and the payload, stored in the clear or, with ``encrypt``, encrypted in the same pass.
Without the integrity key no one can make a chunk that verifies.

``make_sealer`` builds the sealer a tier's options ask for. Both kinds answer the same calls:

* ``seal(identity, key, payload, out)`` returns the header block for ``payload``; an
  encrypting sealer writes the ciphertext into ``out`` (as long as ``payload``), which is then
  what is stored after the header, while ``payload`` is left as it was;
* ``open(header, body, identity, key)`` raises ``IntegrityError`` unless ``header`` + ``body``
  is chunk ``key`` of the identity, sealed as this sealer accepts; an encrypted ``body`` is
  decrypted in place (its bytes are undefined after a failure: never serve them).

Reasons a keyed sealer adds to ``codec``'s: ``forged`` (the tag does not verify: planted or
altered bytes), ``unkeyed`` (a version-1 chunk, written without a key), ``unknown_key`` (sealed
under a key this tier does not hold: rotated out, or another cache's). An unkeyed sealer
answers a version-2 chunk as ``keyed``.

Thread safety: sealers are immutable; any thread, concurrently.
"""

from __future__ import annotations

import hmac
import os
from typing import Any, Protocol

from kvtier.errors import ConfigError, IntegrityError
from kvtier.tiers.shared import codec
from kvtier.tiers.shared.integrity_key import read_integrity_keys

SALT_BYTES = 32
KEY_ID_BYTES = 8
#: An encrypted payload is decrypted this many bytes at a time (``_decrypt_in_place``).
DECRYPT_PIECE = 64 << 10
_NONCE = bytes(12)  # each derived key seals one chunk
_SUBKEY_CONTEXT = b"kvtier chunk v2 aes-256-gcm\0"
_KEY_ID_CONTEXT = b"kvtier integrity key id\0"

Buffer = bytes | bytearray | memoryview


class Sealer(Protocol):
    """Seals and opens chunks (see the module docstring)."""

    keyed: bool
    encrypts: bool

    def seal(
        self,
        identity_digest: bytes,
        key: bytes,
        payload: Buffer,
        out: memoryview | None = None,
        payload_checksum: bytes | None = None,
    ) -> bytes: ...

    def open(
        self,
        header: Buffer,
        body: Buffer,
        identity_digest: bytes,
        key: bytes,
        payload_checksum: bytes | None = None,
    ) -> None: ...


def make_sealer(key_file: str | None, encrypt: bool = False, *, decrypts: bool = True) -> Sealer:
    """The sealer for a tier's ``integrity_key_file`` and ``encrypt`` options.

    ``decrypts``: whether encrypted chunks are accepted (a tier that keeps received chunks
    as they came, like the peer server, takes plaintext ones only). ``ConfigError`` when the
    key file is refused (``integrity_key``), when ``encrypt`` has no key, or when the
    ``cryptography`` package is missing.
    """
    if key_file is None:
        if encrypt:
            raise ConfigError("encrypt: needs integrity_key_file (the key encrypts the chunks)")
        return ChecksumSealer()
    return KeyedSealer(read_integrity_keys(key_file), encrypt, decrypts=decrypts)


class ChecksumSealer:
    """No key: version-1 chunks with an xxh3-128 checksum (``codec``)."""

    keyed = False
    encrypts = False

    def seal(
        self,
        identity_digest: bytes,
        key: bytes,
        payload: Buffer,
        out: memoryview | None = None,
        payload_checksum: bytes | None = None,
    ) -> bytes:
        return codec.encode_header(identity_digest, key, payload, payload_checksum)

    def open(
        self,
        header: Buffer,
        body: Buffer,
        identity_digest: bytes,
        key: bytes,
        payload_checksum: bytes | None = None,
    ) -> None:
        """``payload_checksum``: the body's ``codec.checksum``, when the caller has it."""
        if codec.format_version(header) == codec.SEALED_VERSION:
            raise IntegrityError(
                "chunk is sealed with an integrity key; this tier has none", "keyed"
            )
        codec.verify(header, body, identity_digest, key, payload_checksum)


def key_id(master: bytes) -> bytes:
    """The public name of an integrity key, as chunk headers carry it."""
    return hmac.digest(master, _KEY_ID_CONTEXT, "sha256")[:KEY_ID_BYTES]


class KeyedSealer:
    """Version-2 chunks sealed with ``keys[0]``; opened with any of ``keys`` (rotation)."""

    keyed = True

    def __init__(self, keys: tuple[bytes, ...], encrypt: bool, *, decrypts: bool = True) -> None:
        self._aes = _aes_gcm()
        self._current, self._current_id = keys[0], key_id(keys[0])
        self._by_id = {key_id(k): k for k in reversed(keys)}  # the first of equal ids wins
        self.encrypts, self._decrypts = encrypt, decrypts
        self._algorithm = codec.AES_GCM_ENCRYPTED if encrypt else codec.AES_GCM_TAG

    def seal(
        self,
        identity_digest: bytes,
        key: bytes,
        payload: Buffer,
        out: memoryview | None = None,
        payload_checksum: bytes | None = None,
    ) -> bytes:
        """``payload_checksum`` is not used (the tag replaces it)."""
        salt = os.urandom(SALT_BYTES)
        fields = (identity_digest, key, len(payload), self._current_id, salt)
        header = codec.encode_sealed(self._algorithm, *fields)
        sealing = self._cipher(self._current, salt, None).encryptor()
        sealing.authenticate_additional_data(memoryview(header)[: codec.SEALED_AAD_BYTES])
        if self.encrypts:
            if out is None or len(out) != len(payload):
                raise ValueError("an encrypting sealer needs out, as long as the payload")
            sealing.update_into(payload, out)
        else:
            sealing.authenticate_additional_data(payload)
        sealing.finalize()
        codec.put_tag(header, sealing.tag)
        return bytes(header)

    def open(
        self,
        header: Buffer,
        body: Buffer,
        identity_digest: bytes,
        key: bytes,
        payload_checksum: bytes | None = None,
    ) -> None:
        """Verify (and decrypt in place) chunk ``key``; ``payload_checksum`` is not used."""
        if codec.format_version(header) == codec.FORMAT_VERSION:
            raise IntegrityError("chunk has no integrity tag (written without a key)", "unkeyed")
        sealed = codec.decode_sealed(header)
        master = self._by_id.get(sealed.key_id)
        if master is None:
            raise IntegrityError(
                "chunk is sealed with a key this tier does not hold", "unknown_key"
            )
        if sealed.payload_len != len(body):
            raise IntegrityError(
                f"payload is {len(body)} bytes, header says {sealed.payload_len}", "length"
            )
        self._verify_tag(master, sealed, header, body)
        if sealed.identity_digest != identity_digest:
            raise IntegrityError("chunk belongs to another cache identity", "identity")
        if sealed.key != key:
            raise IntegrityError("chunk holds another key", "key")

    def _verify_tag(
        self, master: bytes, sealed: codec.SealedHeader, header: Buffer, body: Buffer
    ) -> None:
        encrypted = sealed.algorithm == codec.AES_GCM_ENCRYPTED
        if encrypted and not self._decrypts:
            raise IntegrityError("an encrypted chunk where plaintext was expected", "version")
        opening = self._cipher(master, sealed.salt, sealed.tag).decryptor()
        opening.authenticate_additional_data(memoryview(header)[: codec.SEALED_AAD_BYTES])
        if encrypted:
            _decrypt_in_place(opening, memoryview(body).cast("B"))
        else:
            opening.authenticate_additional_data(body)
        try:
            opening.finalize()
        except self._aes.invalid_tag:
            raise IntegrityError(
                "integrity tag mismatch (not sealed with this key)", "forged"
            ) from None

    def _cipher(self, master: bytes, salt: bytes, tag: bytes | None) -> Any:
        subkey = hmac.digest(master, _SUBKEY_CONTEXT + salt, "sha256")
        return self._aes.cipher(self._aes.algorithm(subkey), self._aes.mode(_NONCE, tag))


def _decrypt_in_place(opening: Any, body: memoryview) -> None:
    """Decrypt ``body`` where it lies, a piece at a time through a small scratch buffer that
    stays in cache: ``cryptography`` 51 refuses an output buffer that overlaps the input."""
    scratch = memoryview(bytearray(DECRYPT_PIECE + 15))  # update_into wants block size - 1 more
    done = 0
    for start in range(0, len(body), DECRYPT_PIECE):
        written = opening.update_into(body[start : start + DECRYPT_PIECE], scratch)
        body[done : done + written] = scratch[:written]
        done += written
    if done != len(body):  # GCM is a stream mode: never, unless the library changes
        raise IntegrityError(f"decrypted {done} of {len(body)} bytes", "length")


class _AesGcm:
    """The parts of ``cryptography`` sealing uses, imported when a key is configured."""

    def __init__(self) -> None:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        self.cipher, self.algorithm, self.mode = Cipher, algorithms.AES, modes.GCM
        self.invalid_tag = InvalidTag


def _aes_gcm() -> _AesGcm:
    try:
        return _AesGcm()
    except ImportError:
        raise ConfigError(
            "integrity_key_file: sealing chunks needs the 'cryptography' package: "
            "pip install -e '.[integrity]' in kvtier's clone"
        ) from None
