"""Fixtures of the vLLM end-to-end tests: the cached vLLM venv + model, and the workload.

The venv and model are built on first use (a few minutes, PyPI needed) and cached; a failed
build fails every test here loudly. ``KVTIER_SKIP_VLLM=1`` skips them on purpose (local runs).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.vllm.engine import VllmEnv
from tests.tiers.s3_server import MotoServer, s3_server  # noqa: F401 (s3_server is a fixture)

PROMPT_TOKENS = 1000
MAX_TOKENS = 4


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: runs a real vLLM engine (KVTIER_SKIP_VLLM=1 skips)")


@pytest.fixture(scope="session")
def vllm_env() -> VllmEnv:
    if os.environ.get("KVTIER_SKIP_VLLM") == "1":
        pytest.skip("KVTIER_SKIP_VLLM=1: vLLM end-to-end tests skipped on request")
    try:
        return VllmEnv.build()
    except Exception as exc:  # no PyPI, no disk: say so loudly, never skip
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def prompts() -> dict[str, list[int]]:
    """Four unrelated ~1000-token prompts; each fills 7 full 128-token blocks (896 tokens)."""
    rng = random.Random(12)
    return {name: [rng.randrange(100, 49_000) for _ in range(PROMPT_TOKENS)] for name in "ABCD"}


def request(name: str, tokens: list[int], **extra: Any) -> dict[str, Any]:
    return {"name": name, "prompt_token_ids": tokens, "max_tokens": MAX_TOKENS, **extra}


@pytest.fixture(scope="session")
def vllm_workdir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """Scenario files, engine logs and tier directories; kept (and named) when a test failed."""
    workdir = Path(tempfile.mkdtemp(prefix="kvtier-vllm-"))
    yield workdir
    if request.session.testsfailed:
        print(f"\nvLLM test files and engine logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def moto(s3_server: MotoServer) -> MotoServer:  # noqa: F811 (the imported fixture)
    return s3_server
