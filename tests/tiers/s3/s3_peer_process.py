"""The second process of the shared-bucket test: loads what the first stored, stores its own.

Run as ``python -m tests.tiers.s3.s3_peer_process ENDPOINT PREFIX LOAD_SEED STORE_SEED N`` from the
repository root. Prints one JSON line ``{"loaded_intact": bool, "stored": int}``; exit status 0.
"""

from __future__ import annotations

import json
import sys

import tests.child_process  # noqa: F401  (first: the kvtier of this checkout)

# isort: split
from kvtier import CacheIdentity, TieringManager
from tests.conftest import SMALL_LAYOUT, config, make_keys
from tests.tiers.s3.s3_workload import served_intact, store
from tests.tiers.s3_server import ACCESS_KEY, SECRET_KEY


def main(endpoint: str, prefix: str, load_seed: int, store_seed: int, n: int) -> dict[str, object]:
    identity = CacheIdentity(model="test/model", revision="r1", layout=SMALL_LAYOUT)
    tier = {
        "type": "obj",
        "bucket": "kvtier",
        "endpoint_override": endpoint,
        "prefix": prefix,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
    }
    with TieringManager(config(n, secondary_tiers=[tier]), identity) as manager:
        loaded = served_intact(manager, make_keys(identity, n, seed=load_seed))
        store(manager, make_keys(identity, n, seed=store_seed))
        stored = manager.stats()["tiers"]["obj"].get("store_ok", 0)
    return {"loaded_intact": loaded, "stored": stored}


if __name__ == "__main__":
    endpoint, prefix, *numbers = sys.argv[1:]
    load_seed, store_seed, n = map(int, numbers)
    print(json.dumps(main(endpoint, prefix, load_seed, store_seed, n)))
