"""A server of its own model writing prefixes into a shared fs directory (run as a process).

``python shared_bound_writer.py ROOT MODEL BOUND CHAINS CHUNKS``: stores ``CHAINS`` prompts of
``CHUNKS`` chunks each through a real manager with an fs tier under ``root_dir_max_bytes``
``BOUND``, then prints the tier's stats as JSON.
"""

from __future__ import annotations

import json
import sys

from kvtier import CacheIdentity, TieringManager
from tests.conftest import SMALL_LAYOUT, config, make_keys, store


def main(root: str, model: str, bound: int, chains: int, chunks: int) -> None:
    identity = CacheIdentity(model=model, layout=SMALL_LAYOUT)
    tier = {"type": "fs", "root_dir": root, "name": "disk", "min_free_bytes": 0}
    tiers = [{**tier, "root_dir_max_bytes": bound, "n_write_threads": 2}]
    with TieringManager(config(2 * chunks, secondary_tiers=tiers), identity) as manager:
        for seed in range(chains):
            keys = make_keys(identity, chunks, seed=seed)
            store(manager, keys)
            assert manager.wait_idle(timeout=60)
        print(json.dumps(manager.stats()["tiers"]["disk"]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
