"""Integrity key files (``integrity_key_file``): the secret that seals chunks (``sealing``).

A key file is text: one key per line, 64 hex digits (32 random bytes), the first line the key
new chunks are sealed with and the others still accepted (rotation); blank lines and lines
starting with ``#`` are skipped. Make one with::

    (umask 077; python3 -c 'import secrets; print(secrets.token_hex(32))' > chunks.key)

It is held to the rules of the CURVE secret key files (``peer.curve_keys``): a regular file,
owned by this user (or root), with no permission for its group or other users (mode 0600 or
0400). Anything else is refused with a ``ConfigError`` naming the file and what to do; a key's
bytes never appear in an error.

Thread safety: plain functions; any thread.
"""

from __future__ import annotations

import os
import stat

from kvtier.errors import ConfigError

KEY_BYTES = 32
#: More than any rotation needs; a key file is read whole, and bounded.
MAX_KEYS = 16
MAX_FILE_BYTES = 64 << 10


def read_integrity_keys(path: str, what: str = "integrity_key_file") -> tuple[bytes, ...]:
    """The keys of key file ``path``, current first; ``ConfigError`` naming ``what`` when it
    cannot be read, is not private, or does not hold 1 to ``MAX_KEYS`` keys."""
    expanded = os.path.expanduser(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(expanded, flags)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path} ({exc.strerror or exc})") from None
    try:
        check_private(os.fstat(fd), path, what)
        data = _read_bounded(fd, path, what)
    finally:
        os.close(fd)
    return parse_keys(data, path, what)


def check_private(found: os.stat_result, path: str, what: str) -> None:
    """``ConfigError`` unless ``found`` is a regular file of this user's (or root's) that its
    group and other users can neither read nor write."""
    if not stat.S_ISREG(found.st_mode):
        raise ConfigError(f"{what}: {path} is not a regular file")
    mode = stat.S_IMODE(found.st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"{what}: {path} has mode {mode:04o}: other users may read or change the key; "
            f"it must be private: chmod 600 {path}"
        )
    if found.st_uid not in (os.geteuid(), 0):
        raise ConfigError(
            f"{what}: {path} belongs to uid {found.st_uid}, not to this user "
            f"(uid {os.geteuid()}) nor root; another user could change the key"
        )


def _read_bounded(fd: int, path: str, what: str) -> bytes:
    parts, total = [], 0
    while part := os.read(fd, MAX_FILE_BYTES + 1 - total):
        parts.append(part)
        total += len(part)
        if total > MAX_FILE_BYTES:
            raise ConfigError(f"{what}: {path} is larger than {MAX_FILE_BYTES} bytes")
    return b"".join(parts)


def parse_keys(data: bytes, path: str, what: str) -> tuple[bytes, ...]:
    """The keys of a key file's text (``read_integrity_keys`` documents the format)."""
    keys: list[bytes] = []
    for number, raw in enumerate(data.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(b"#"):
            continue
        try:
            key = bytes.fromhex(line.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            key = b""
        if len(key) != KEY_BYTES:
            raise ConfigError(
                f"{what}: {path} line {number}: expected {2 * KEY_BYTES} hex digits "
                f"(a {KEY_BYTES}-byte key)"
            )
        keys.append(key)
    if not 1 <= len(keys) <= MAX_KEYS:
        raise ConfigError(f"{what}: {path} holds {len(keys)} keys, expected 1 to {MAX_KEYS}")
    return tuple(keys)
