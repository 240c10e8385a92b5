"""Fixtures of the SGLang tests: the cached SGLang venv (built on first use) and workdirs.

The venv and model are built on first use (minutes, PyPI needed) and cached under
``KVTIER_SGLANG_CACHE`` (default ``~/.cache/kvtier-test/sglang-cpu-0.5.23``); a failed build
fails every test that needs it, loudly. ``KVTIER_SKIP_SGLANG=1`` skips them on purpose. The
contract tests of ``test_backend.py`` need neither.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.sglang.engine import HERE, SglangEnv
from tests.tiers.s3_server import MotoServer, s3_server  # noqa: F401 (s3_server is a fixture)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sglang: needs the SGLang venv (KVTIER_SKIP_SGLANG=1 skips)")


@pytest.fixture(scope="session")
def sglang_env() -> SglangEnv:
    if os.environ.get("KVTIER_SKIP_SGLANG") == "1":
        pytest.skip("KVTIER_SKIP_SGLANG=1: SGLang tests skipped on request")
    try:
        return SglangEnv.build()
    except Exception as exc:  # no PyPI, no disk: say so loudly, never skip
        pytest.fail(str(exc), pytrace=False)


def in_venv(env: SglangEnv, *args: str) -> Any:
    """``in_venv.py ARGS`` in the SGLang venv; its JSON result (fails with its output)."""
    done = env.run(HERE / "in_venv.py", *args)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.fixture(scope="session")
def sglang_workdir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """Engine logs and L3 directories; kept (and named) when a test failed."""
    workdir = Path(tempfile.mkdtemp(prefix="kvtier-sglang-"))
    yield workdir
    if request.session.testsfailed:
        print(f"\nSGLang test files and engine logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def moto(s3_server: MotoServer) -> MotoServer:  # noqa: F811 (the imported fixture)
    return s3_server
