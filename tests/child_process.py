"""Imported first by every module the tests run as a child process (``python -m tests...``).

It puts this checkout's ``src`` first on ``sys.path``, so that the child imports the kvtier under
test rather than whatever kvtier is installed. Launchers pass ``child_env()`` as well, which does
the same through ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

if sys.path[:1] != [str(SRC)]:
    sys.path.insert(0, str(SRC))


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with ``src`` and the repository root first on PYTHONPATH."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = os.pathsep.join([str(SRC), str(ROOT), *inherited])
    return {**os.environ, "PYTHONPATH": path, **extra}
