"""Child processes of the tests run the kvtier of this checkout, never another one installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_process import ROOT, SRC, child_env

PRINT_ORIGIN = "import kvtier; print(kvtier.__file__)"


@pytest.fixture
def decoy(tmp_path: Path) -> Path:
    """A directory holding another package named kvtier."""
    (tmp_path / "kvtier").mkdir()
    (tmp_path / "kvtier" / "__init__.py").write_text("")
    return tmp_path


def origin(code: str, env: dict[str, str]) -> Path:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr.decode()
    return Path(out.stdout.decode().strip()).resolve()


def test_a_child_module_imports_src_first(decoy: Path) -> None:
    """What ``python -m tests.tiers.<child>`` does before any kvtier import."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(decoy), str(ROOT)])}
    assert origin(PRINT_ORIGIN, env) == decoy / "kvtier" / "__init__.py"  # the decoy wins...
    got = origin("import tests.child_process; " + PRINT_ORIGIN, env)
    assert got == SRC / "kvtier" / "__init__.py"  # ...unless the child module comes first


def test_child_env_puts_src_first(decoy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(decoy))
    assert origin(PRINT_ORIGIN, child_env()) == SRC / "kvtier" / "__init__.py"
