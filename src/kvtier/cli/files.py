"""Files the command line reads and writes: inputs that cannot hang it, outputs never half-written.

* ``open_input`` opens a file a command reads (a trace, a capture, a bench JSON) only if it is a
  regular file: a FIFO would wait for a writer for ever, ``/dev/zero`` would stream for ever.
* ``check_output`` is run before a command does its work: an output path that is a directory, a
  FIFO or a device, or whose directory is missing, is a ``UsageError`` before anything is
  computed (a FIFO would block the write; renaming over a device would replace it).
* ``atomic_output`` writes to a temporary file next to the output and renames it into place
  when the block ends without an exception, so a failed command leaves no empty or partial
  file; the temporary file is removed whatever happens.

Outputs get the mode a plain ``open`` gives (0666 less the umask), as any shell redirection: they
are the user's files. Every failure is a ``UsageError`` naming the flag, the path and why.
Thread safety: plain functions; any thread.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from kvtier.cli.common import UsageError

_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _reason(exc: OSError | ValueError) -> str:
    if isinstance(exc, ValueError):  # a NUL in the path
        return "not a valid path"
    return exc.strerror or str(exc)


def open_input(path: str, what: str) -> IO[bytes]:
    """``path`` open for reading in binary; ``UsageError`` (naming ``what``, e.g. ``capture``)
    unless it is a regular file that can be opened. Never blocks."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{what} {path}: {_reason(exc)}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{what} {path}: not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def check_output(path: str | Path, flag: str) -> Path:
    """The path ``path`` names, links resolved; ``UsageError`` (naming ``flag``) when it exists
    and is not a regular file, or its directory does not exist or is not a directory."""
    if not str(path):
        raise UsageError(f"{flag}: expected a file name, got ''")
    try:
        target = Path(os.path.realpath(path))
        found = os.stat(target)
    except FileNotFoundError:
        found = None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{flag} {path}: {_reason(exc)}") from None
    if found is not None and not stat.S_ISREG(found.st_mode):
        raise UsageError(f"{flag} {path}: not a regular file")
    if not target.parent.is_dir():
        why = "is not a directory" if target.parent.exists() else "does not exist"
        raise UsageError(f"{flag} {path}: directory {target.parent} {why}")
    return target


@contextmanager
def atomic_output(path: str | Path, flag: str, *, binary: bool = False) -> Iterator[IO[Any]]:
    """A file open for writing (text, or bytes with ``binary``) that becomes ``path`` only when
    the block ends without an exception; otherwise it is removed and ``path`` is untouched.

    ``UsageError`` (naming ``flag``) when ``path`` cannot be an output (``check_output``), or
    when creating, writing (an ``OSError`` in the block) or renaming the file fails; any other
    exception in the block propagates.
    """
    target = check_output(path, flag)
    tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
    try:
        with os.fdopen(os.open(tmp, _WRITE_FLAGS, 0o666), "wb" if binary else "w") as file:
            yield file
        os.replace(tmp, target)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: {_reason(exc)}") from None
    finally:
        with suppress(OSError):
            os.unlink(tmp)
