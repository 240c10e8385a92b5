"""Building (or reusing) an engine's cached test venv with its build script, for the vLLM and
SGLang harnesses."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

#: The first build downloads and installs an engine; later ones find it done at once.
BUILD_TIMEOUT_S = 1800
ROOT = Path(__file__).resolve().parents[2]


def build_cached_venv(script: Path, env_var: str, name: str) -> tuple[Path, Path, float]:
    """Run ``script CACHE ROOT`` where CACHE is ``$env_var`` or ``~/.cache/kvtier-test/name``;
    returns the venv's python, the cached model and the seconds it took. ``RuntimeError`` with
    the end of the build's log when it fails."""
    cache = Path(os.environ.get(env_var, Path.home() / ".cache" / "kvtier-test" / name))
    start = time.perf_counter()
    done = subprocess.run(
        ["bash", str(script), str(cache), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the {name} test venv failed:\n{done.stderr[-4000:]}")
    return cache / "venv" / "bin" / "python", cache / "smollm2", time.perf_counter() - start
