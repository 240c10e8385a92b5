"""A bench JSON names what made it: ``provenance`` on a real git checkout, a dirty one, a
directory that is not one, and a git that hangs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import kvtier
from kvtier.bench import provenance

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git repository laid out as a kvtier checkout (``src/kvtier``), one commit made."""
    repo = tmp_path / "repo"
    (repo / "src" / "kvtier").mkdir(parents=True)
    (repo / "src" / "kvtier" / "__init__.py").write_text("")
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", ".")
    config = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    _git(repo, *config, "-c", "core.hooksPath=/dev/null", "commit", "-qm", "one")
    return repo


@needs_git
def test_a_clean_checkout_gives_its_short_commit(checkout: Path) -> None:
    assert provenance.checkout_commit(checkout) == _git(checkout, "rev-parse", "--short", "HEAD")


@needs_git
def test_uncommitted_changes_to_tracked_files_add_a_plus(checkout: Path) -> None:
    head = _git(checkout, "rev-parse", "--short", "HEAD")
    (checkout / "untracked.txt").write_text("not part of the run's code")
    assert provenance.checkout_commit(checkout) == head
    (checkout / "src" / "kvtier" / "__init__.py").write_text("X = 1\n")
    assert provenance.checkout_commit(checkout) == head + "+"


@needs_git
def test_a_git_repository_that_is_not_a_kvtier_checkout_names_no_commit(tmp_path: Path) -> None:
    """An installed kvtier lives in site-packages, which may sit inside some other repository
    (a project's venv): its commit would say nothing about kvtier."""
    _git(tmp_path, "init", "-q", str(tmp_path / "other"))
    assert provenance.checkout_commit(tmp_path / "other") is None
    assert provenance.checkout_commit(tmp_path) is None


@needs_git
def test_a_git_that_hangs_costs_the_timeout_and_names_no_commit(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "git").write_text("#!/bin/sh\nexec sleep 30\n")
    (fake / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(provenance, "GIT_TIMEOUT_S", 0.2)
    assert provenance.checkout_commit(checkout) is None


@needs_git  # the fixture needs git; the test then hides it
def test_a_missing_git_names_no_commit(checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert provenance.checkout_commit(checkout) is None


def test_the_document_is_written_with_the_run_first(tmp_path: Path) -> None:
    path = tmp_path / "deeper" / "bench.json"
    provenance.write_json({"results": [1, 2], "headline": {"x": 1}}, path)
    loaded = json.loads(path.read_text())
    assert list(loaded) == ["run", "results", "headline"]
    run = loaded["run"]
    assert run["kvtier_version"] == kvtier.__version__
    assert run["command"].startswith("kvtier")
    assert run["cpus"] == os.cpu_count() and len(run["load_average"]) == 3
    assert run["written_at"].endswith("+00:00")
    assert run["commit"] == provenance.checkout_commit()


def test_the_command_line_is_the_arguments_given() -> None:
    record = provenance.run_record(["bench", "--engine", "vllm", "--repeat", "20"])
    assert record["command"] == "kvtier bench --engine vllm --repeat 20"


def test_an_argument_with_a_space_is_quoted_as_a_shell_needs_it() -> None:
    record = provenance.run_record(["bench", "--output-dir", "my results"])
    assert record["command"] == "kvtier bench --output-dir 'my results'"


def test_a_load_average_that_cannot_be_read_is_none_and_the_json_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreadable() -> tuple[float, float, float]:
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", unreadable)
    provenance.write_json({"results": []}, tmp_path / "bench.json")
    assert json.loads((tmp_path / "bench.json").read_text())["run"]["load_average"] is None
