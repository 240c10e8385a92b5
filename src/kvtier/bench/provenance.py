"""What names a bench run in the JSON it writes, so a published figure can say what made it.

Every ``kvtier bench`` mode writes its document through ``write_json``, which puts ``run``
first: the kvtier version, the commit of the checkout kvtier was imported from (``git
rev-parse --short HEAD``, with ``+`` when tracked files had uncommitted changes; ``None`` when
kvtier is an installed package, or git is missing or one of its two calls takes over
``GIT_TIMEOUT_S``), the command line (quoted as a shell would need it), when the document was
written (UTC) and the machine's CPUs and load average then (``None`` where it cannot be read).
None of it changes what the run measured; a field that cannot be known never fails a run.

Thread safety: plain functions; any thread (the bench calls them once, at the end).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kvtier

GIT_TIMEOUT_S = 5.0
#: The checkout kvtier runs from, when it runs from one: ``src/kvtier`` -> the repository.
CHECKOUT = Path(kvtier.__file__).resolve().parents[2]


def run_record(argv: list[str] | None = None) -> dict[str, Any]:
    """The ``run`` field: version, commit, command, time, CPUs and load average."""
    args = sys.argv[1:] if argv is None else argv
    return {
        "kvtier_version": kvtier.__version__,
        "commit": checkout_commit(),
        "command": shlex.join(["kvtier", *args]),
        "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average": _load_average(),
    }


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # not readable here, or a platform without it
        return None


def checkout_commit(checkout: Path = CHECKOUT) -> str | None:
    """The short commit of ``checkout`` (``+`` when dirty), or ``None`` when it is not a git
    checkout of kvtier or git cannot say in time."""
    if not (checkout / ".git").exists() or not (checkout / "src" / "kvtier").is_dir():
        return None
    rev = _git(checkout, "rev-parse", "--short", "HEAD")
    dirty = _git(checkout, "status", "--porcelain", "--untracked-files=no")
    if rev is None or dirty is None:
        return None
    return rev + ("+" if dirty else "")


def _git(checkout: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(checkout), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},  # a status must not take the lock
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def write_json(document: dict[str, Any], path: Path) -> None:
    """Write ``document`` to ``path`` as indented JSON, with ``run`` (``run_record``) first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stamped = {"run": run_record(), **document}
    path.write_text(json.dumps(stamped, indent=2) + "\n")
