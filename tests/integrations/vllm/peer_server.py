"""A kvtier instance serving its host memory to peers, for a vLLM engine's ``KvtierPeer`` tier.

``python peer_server.py IDENTITY_JSON PORT SLOTS``: the identity is read from the
``identity.json`` a kvtier tier of the engine wrote (so it is the engine's), the host tier holds
``SLOTS`` chunks and accepts stores from peers. Prints ``READY`` and serves until SIGTERM.
"""

from __future__ import annotations

import json
import signal
import sys
import threading

from kvtier import TieringConfig, TieringManager
from kvtier.integrations.vllm.identity import identity_from_description
from kvtier.region import round_up


def main(identity_file: str, port: int, slots: int) -> None:
    with open(identity_file) as file:
        written = json.load(file)
    identity = identity_from_description(written["identity"])
    assert identity.hexdigest == written["digest"], "identity.json does not round-trip"
    stride = round_up(identity.layout.chunk_bytes, 4096)
    serve = {"port": port, "accept_stores": True}
    config = TieringConfig.from_dict({"cpu_bytes_to_use": slots * stride, "serve": serve})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with TieringManager(config, identity):
        print("READY", flush=True)
        stop.wait()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
