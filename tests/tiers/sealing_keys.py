"""Integrity key files for the tests of sealed chunks, and the attacker script run as a process."""

from __future__ import annotations

import hmac
import os
import subprocess
import sys
from pathlib import Path

ATTACKER = Path(__file__).with_name("attacker.py")
#: Chunks the attacker wrote carry this, repeated.
PLANTED = b"planted!"
KEY_A, KEY_B, KEY_C = (bytes([n]) * 32 for n in (0xA1, 0xB2, 0xC3))


def key_id(key: bytes) -> bytes:
    """The id a sealed header names ``key`` by, as docs/security.md states it."""
    return hmac.digest(key, b"kvtier integrity key id\0", "sha256")[:8]


def key_file(path: Path, *keys: bytes) -> str:
    """A private key file holding ``keys``, the first current."""
    path.write_text("".join(key.hex() + "\n" for key in keys))
    path.chmod(0o600)
    return str(path)


def attack(*args: str, env: dict[str, str] | None = None) -> list[str]:
    """Run the attacker (a plain script: no kvtier import) with ``env`` added to the
    environment; its output lines."""
    command = [sys.executable, str(ATTACKER), *args]
    done = subprocess.run(
        command, capture_output=True, timeout=60, env={**os.environ, **(env or {})}
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().split("\n")[:-1]
