"""CURVE keys of the peer tier: key pairs written by ``kvtier peer keygen``, and read back.

Secret key files are private (mode 0600 in a 0700 directory) and never overwritten.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

import zmq

from kvtier.config.file_modes import DEFAULT_DIR_MODE, DEFAULT_FILE_MODE, make_dirs
from kvtier.errors import ConfigError


@dataclass(frozen=True)
class CurveClient:
    secret_key: bytes
    public_key: bytes
    server_key: bytes


@dataclass(frozen=True)
class CurveServer:
    secret_key: bytes
    public_key: bytes
    allowed: frozenset[bytes]


def write_keypair(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``NAME.public`` (mode 0644) and ``NAME.secret`` (mode 0600), Z85 text, into
    ``directory``, which is made (mode 0700, parents too) where missing.

    ``name`` is a file name, not a path (the caller checks it). Raises ``FileExistsError``
    naming the first key file that exists (nothing is written: a key is never overwritten),
    ``NotADirectoryError`` when ``directory`` is something else, another ``OSError`` when it
    cannot be made or written; on failure no key file is left behind.
    """
    folder = Path(directory)
    make_dirs(str(folder), DEFAULT_DIR_MODE)
    public_path, secret_path = folder / f"{name}.public", folder / f"{name}.secret"
    for path in (secret_path, public_path):
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "exists", str(path))
    public, secret = zmq.curve_keypair()
    _write_new(secret_path, secret + b"\n", DEFAULT_FILE_MODE)
    try:
        _write_new(public_path, public + b"\n", 0o644)
    except BaseException:
        secret_path.unlink(missing_ok=True)
        raise
    return public_path, secret_path


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` (never over an existing entry, never through a link) holding ``data``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def read_key(path: str | Path, what: str) -> bytes:
    """A Z85 CURVE key (40 characters) from a key file; ``ConfigError`` naming ``what``."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path} ({exc.strerror or exc})") from None
    if len(key) != 40:
        raise ConfigError(f"{what}: {path} does not hold a Z85 CURVE key (40 characters)")
    return key


def client_keys(secret_file: str, server_key_file: str) -> CurveClient:
    secret = read_key(secret_file, "curve_secret_key_file")
    server = read_key(server_key_file, "curve_server_key_file")
    return CurveClient(secret, zmq.curve_public(secret), server)


def server_keys(secret_file: str, client_keys_dir: str) -> CurveServer:
    secret = read_key(secret_file, "curve_secret_key_file")
    files = sorted(Path(client_keys_dir).glob("*.public"))
    if not files:
        raise ConfigError(f"curve_client_keys_dir: no *.public key files in {client_keys_dir}")
    allowed = frozenset(read_key(f, "curve_client_keys_dir") for f in files)
    return CurveServer(secret, zmq.curve_public(secret), allowed)
