"""A real S3-protocol server for the tests: moto in server mode, in its own process.

Its own process, so that it can be killed, frozen (SIGSTOP) and restarted on the same port, and
so that its per-connection threads never show up in this process. Objects live in its memory.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kvtier.config import ObjTierConfig
from kvtier.identity import CacheIdentity
from kvtier.region import HostRegion
from kvtier.tiers.base import SecondaryTier
from tests.conftest import freeze_process

ACCESS_KEY, SECRET_KEY = "kvtier-test-access", "kvtier-test-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class MotoServer:
    """``python -m moto.server`` on 127.0.0.1:``port``; ``env`` adds environment variables."""

    def __init__(self, port: int | None = None, env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._env = {**os.environ, **(env or {})}
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> MotoServer:
        pytest.importorskip("moto.server")
        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self._proc = subprocess.Popen(
            cmd, env=self._env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto server on port {self.port} did not start")
            time.sleep(0.05)
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def freeze(self) -> None:
        """The process stops answering but keeps its sockets: requests hang until timeouts."""
        assert self._proc is not None
        freeze_process(self._proc.pid)

    def thaw(self) -> None:
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGCONT)

    def create_bucket(self, name: str | None = None) -> str:
        """A new bucket (moto accepts unsigned requests unless auth is switched on)."""
        name = name or f"b-{uuid.uuid4().hex[:12]}"
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=10):
            return name

    def tier_config(self, bucket: str, **options: Any) -> ObjTierConfig:
        defaults: dict[str, Any] = {
            "endpoint_override": self.endpoint,
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
            "prefix": f"t-{uuid.uuid4().hex[:8]}",
            "io_threads": 4,
        }
        return ObjTierConfig(bucket=bucket, **{**defaults, **options})

    def tier(
        self, bucket: str, region: HostRegion, identity: CacheIdentity, **options: Any
    ) -> SecondaryTier:
        from kvtier.tiers.s3.tier import ObjectStoreTier

        return ObjectStoreTier(self.tier_config(bucket, **options), region, identity)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoServer]:
    """One moto server for the session, with a bucket named ``kvtier``."""
    server = MotoServer().start()
    server.create_bucket("kvtier")
    yield server
    server.stop()
