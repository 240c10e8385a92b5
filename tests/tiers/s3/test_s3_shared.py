"""Two managers in two processes share one bucket: what one stores, the other loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kvtier import TieringManager
from tests.conftest import config, make_keys
from tests.tiers.s3.s3_workload import served_intact, store
from tests.tiers.s3_server import ACCESS_KEY, SECRET_KEY, MotoServer

ROOT = Path(__file__).resolve().parents[3]
N = 6


def test_two_processes_share_a_bucket(s3_server: MotoServer, identity):
    """This process stores A; the other loads A intact and stores B; this process loads B."""
    tier = {
        "type": "obj",
        "bucket": "kvtier",
        "endpoint_override": s3_server.endpoint,
        "prefix": "shared",
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
    }
    with TieringManager(config(N, secondary_tiers=[tier]), identity) as manager:
        store(manager, make_keys(identity, N, seed=50))
        other = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.tiers.s3.s3_peer_process",
                s3_server.endpoint,
                "shared",
                "50",
                "51",
                str(N),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert other.returncode == 0, other.stderr
        assert json.loads(other.stdout.splitlines()[-1]) == {"loaded_intact": True, "stored": N}
        assert served_intact(manager, make_keys(identity, N, seed=51))
        assert manager.stats()["tiers"]["obj"]["load_ok"] == N
