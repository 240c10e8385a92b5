"""The install instructions of the README work from a clone (issue 30).

* Every ``pip install`` of kvtier in the README (and the examples) installs the clone
  (``pip install -e '.[extras]'``): kvtier is not on PyPI, so ``pip install 'kvtier[s3]'``
  finds nothing. Every extra named exists in ``pyproject.toml``, and the README's table of
  features lists every extra there is.
* A fresh clone installs: the files git tracks are copied to a new directory, built into a
  wheel there (``pip wheel``, no network: the build uses this venv's setuptools), and the wheel
  is installed into a fresh venv, where ``kvtier --version`` runs and the compiled module is
  present. The fresh venv borrows this venv's third-party packages (numpy...) through a
  ``.pth`` line, so nothing is downloaded; kvtier itself comes from the wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

import kvtier

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])
#: ``pip install ...`` as written in prose or in a shell block, up to the end of its quote/line.
PIP_INSTALL = re.compile(r"pip install ((?:-[-\w]+ )*)(['\"]?)([^\s'\"`]+)\2")


def documents() -> list[Path]:
    return [
        REPO / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "examples").glob("*.py")),
    ]


def installs(text: str) -> list[tuple[str, str]]:
    """(flags, target) of every ``pip install`` in ``text`` (lines joined: prose wraps)."""
    joined = re.sub(r"\s*\n\s*", " ", text)
    return [(m.group(1), m.group(3)) for m in PIP_INSTALL.finditer(joined)]


def kvtier_installs() -> list[tuple[Path, str, str]]:
    found = []
    for path in documents():
        for flags, target in installs(path.read_text()):
            if target.startswith((".", "kvtier")):
                found.append((path, flags, target))
    return found


def test_the_readme_installs_kvtier_from_the_clone_with_extras_that_exist():
    found = kvtier_installs()
    assert len(found) >= 4, found  # the Install section, vLLM, obj, p2p
    for path, flags, target in found:
        where = f"{path.name}: pip install {flags}{target}"
        assert target.startswith("."), f"{where}: kvtier is not on PyPI; install the clone"
        assert "-e" in flags.split() or target == ".", where
        named = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
        assert named is not None, where
        assert set((named.group(1) or "").split(",")) - {""} <= EXTRAS, where


def test_the_readme_install_table_lists_every_extra():
    readme = (REPO / "README.md").read_text()
    assert "\n## Install\n" in readme, "the README has no Install section"
    section = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\|[^|]+\| `([\w-]+)` \|", section, flags=re.MULTILINE))
    assert listed == EXTRAS


def test_the_version_is_the_package_version():
    assert kvtier.__version__ == PYPROJECT["project"]["version"]


def test_the_security_page_states_the_fs_tier_defaults_the_code_has():
    """(docs/configuration.md's default is checked against the code by tests/docs.)"""
    from kvtier.config import FsTierConfig

    default = FsTierConfig(root_dir="/x").dir_mode.lstrip("0")
    files = oct(int(default, 8) & 0o666)[2:]
    security = (REPO / "docs" / "security.md").read_text()
    section = security.split("## Files kvtier creates", 1)[1].split("\n## ", 1)[0]
    assert f"`dir_mode`, 0{default} by default" in section
    assert f"without execute, 0{files} by default" in section


def clone(destination: Path) -> Path:
    """The files git tracks (as they are in the working tree), copied to ``destination``."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    for name in tracked.stdout.decode().split("\0"):
        source = REPO / name
        if name and source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


@pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a clone"
)
def test_a_fresh_clone_builds_and_installs(tmp_path):
    source = clone(tmp_path / "kvtier")
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [
            *pip,
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("kvtier-*.whl")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    subprocess.run(
        [*pip, "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=600,
    )
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")  # numpy, xxhash...
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [str(venv / "bin" / "kvtier"), "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"kvtier {kvtier.__version__} ({site / 'kvtier'})"
    check = "import kvtier.tiers.fs.native as n, kvtier, importlib.metadata as m; "
    check += "print(n.AVAILABLE, sorted(m.metadata('kvtier').get_all('Provides-Extra')))"
    result = subprocess.run(
        [str(python), "-c", check],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    compiled = sys.platform.startswith("linux") and shutil.which("cc") is not None
    assert result.stdout.split(" ", 1) == [str(compiled), f"{sorted(EXTRAS)}\n"], result.stderr
