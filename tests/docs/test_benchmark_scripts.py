"""Every script in ``benchmarks/`` still imports against today's package.

The scripts are run by hand, not by the suite, so a moved name broke one unnoticed
(``p2p_tier.py`` imported ``MAX_IN_FLIGHT`` from ``peer.link`` after it moved to
``peer.protocol``). Importing each one (``main`` is not run) catches that; each must also say
what it measures (its docstring) and have a ``main``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def test_there_are_scripts_to_check() -> None:
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_script_imports_and_has_a_main(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import each other by name
    monkeypatch.setattr(sys, "argv", [script.name])
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None))
    assert module.__doc__ and len(module.__doc__.strip()) > 40
