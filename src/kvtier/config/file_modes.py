"""The modes of what kvtier creates on disk: private unless configured otherwise.

Chunks hold prompt content and key files hold secrets, so kvtier creates its directories with
mode 0700 and its files with mode 0600. The fs tier's ``dir_mode`` option opens its cache to a
group (``"0750"``, ``"0770"``): its files then get the same bits without execute
(``file_mode``). The mode is given to ``mkdir``/``open``, so the process umask can take bits
away but never add them. Directories that already exist keep their mode: kvtier never changes
the mode of what it did not create, and ``open_to_others`` says when one grants more than
``dir_mode`` (the fs tier warns at start, ``kvtier config check`` warns too).

Thread safety: plain functions; any thread.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from contextlib import suppress

#: Directories kvtier creates (owner only), and the files in them.
DEFAULT_DIR_MODE = 0o700
DEFAULT_FILE_MODE = 0o600

_OCTAL_MODE = re.compile(r"(0o?)?[0-7]{3}")


def parse_mode(text: str) -> int | None:
    """The mode an octal string such as ``"0750"``, ``"750"`` or ``"0o750"`` gives; ``None``
    unless it is three octal digits that leave the owner read, write and search."""
    if not _OCTAL_MODE.fullmatch(text):
        return None
    mode = int(text[-3:], 8)
    return mode if mode & 0o700 == 0o700 else None


def file_mode(dir_mode: int) -> int:
    """The mode of files in directories of ``dir_mode``: the same bits without execute."""
    return dir_mode & 0o666


def make_dirs(path: str, mode: int) -> None:
    """Create directory ``path`` and every missing parent, each with ``mode`` (less the umask);
    existing directories are left as they are.

    Unlike ``os.makedirs``, the parents get ``mode`` too. Raises ``NotADirectoryError`` when
    ``path`` or a parent is something else than a directory, another ``OSError`` when it cannot
    be made.
    """
    head, tail = os.path.split(path)
    if not tail:
        head, tail = os.path.split(head)
    if head and tail and not os.path.exists(head):
        with suppress(FileExistsError):  # made meanwhile by another thread or process
            make_dirs(head, mode)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not os.path.isdir(path):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path) from None


def open_to_others(path: str, dir_mode: int = DEFAULT_DIR_MODE) -> str | None:
    """Why directory ``path`` is more open than ``dir_mode`` (``"mode 0755"``...), or ``None``
    when it is not, or does not exist or cannot be read."""
    try:
        found = stat.S_IMODE(os.stat(path).st_mode)
    except (OSError, ValueError):
        return None
    extra = found & ~dir_mode & 0o077
    if not extra:
        return None
    groups = (("its group", 0o070), ("other users", 0o007))
    who = " and ".join(name for name, bits in groups if extra & bits)
    return f"mode {found:04o} lets {who} in, beyond dir_mode {dir_mode:04o}"
