"""A kvtier instance in its own process that serves its host tier to peers (for the p2p tests).

``python -m tests.tiers.peer_node PORT [--store N --seed S] [--accept-stores] [--curve DIR]``
stores N chunks (``chunk_pattern`` bytes) of the small test layout, prints ``READY``, and runs
idle (never polling) until SIGTERM: the peer server's own driver answers. With ``--curve DIR`` it
uses ``DIR/server.secret`` and allows the client keys in ``DIR/clients``. ``--fs DIR`` adds a
filesystem tier under the host tier; chunks are stored ``--slots`` at a time, so with more chunks
than slots the older ones leave host memory and live on in that tier.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from kvtier import CacheIdentity, TieringManager
from kvtier.config import P2PTierConfig
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.peer import PeerTier
from tests.conftest import SMALL_LAYOUT, config, fill, freeze_process, make_keys

ROOT = Path(__file__).resolve().parents[2]


class PeerNode:
    """Runs this module in a subprocess serving on ``port``; ``args`` are its options."""

    def __init__(self, port: int, *args: str) -> None:
        self.port, self.args = port, args
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> PeerNode:
        cmd = [sys.executable, "-m", "tests.tiers.peer_node", str(self.port), *self.args]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self._proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()  # bounded by the test's own timeout
        if line.strip() != b"READY":
            self.kill()
            raise RuntimeError(f"peer node on port {self.port} did not start")
        return self

    def tier(self, region: HostRegion, identity: CacheIdentity, **options: object) -> PeerTier:
        """A client tier of this node."""
        p2p = P2PTierConfig(host="127.0.0.1", port=self.port, **options)  # type: ignore[arg-type]
        return PeerTier(p2p, region, identity)

    def signal(self, signum: int) -> None:
        assert self._proc is not None
        os.kill(self._proc.pid, signum)

    def freeze(self) -> None:
        """SIGSTOP, waiting until every thread of the node has stopped."""
        assert self._proc is not None
        freeze_process(self._proc.pid)

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def stop(self) -> int:
        """SIGTERM, then wait: the node closes its manager; returns its exit code."""
        assert self._proc is not None
        self._proc.terminate()
        code = self._proc.wait(timeout=30)
        self._proc = None
        return code


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--store", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", type=int, default=0, help="store only keys[skip:]")
    parser.add_argument("--slots", type=int, default=256)
    parser.add_argument("--accept-stores", action="store_true")
    parser.add_argument("--curve")
    parser.add_argument("--fs")
    parser.add_argument("--model", default="test/model")
    return parser.parse_args()


def serve_config(args: argparse.Namespace) -> dict[str, object]:
    serve: dict[str, object] = {"port": args.port, "accept_stores": args.accept_stores}
    if args.curve:
        serve["curve_secret_key_file"] = f"{args.curve}/server.secret"
        serve["curve_client_keys_dir"] = f"{args.curve}/clients"
    extra: dict[str, object] = {"serve": serve}
    if args.fs:
        extra["secondary_tiers"] = [{"type": "fs", "root_dir": args.fs}]
    return extra


def store(manager: TieringManager, keys: list[ChunkKey], batch: int) -> None:
    for start in range(0, len(keys), batch):
        plan = manager.prepare_store(keys[start : start + batch])
        assert plan is not None
        for key, slot in zip(plan.keys, plan.slots, strict=True):
            fill(manager.region, slot, key)
        manager.complete_store(plan.keys, success=True)
        assert manager.wait_idle(timeout=30)


def main() -> None:
    args = parse_args()
    identity = CacheIdentity(model=args.model, revision="r1", layout=SMALL_LAYOUT)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with TieringManager(config(args.slots, **serve_config(args)), identity) as manager:
        store(manager, make_keys(identity, args.store, seed=args.seed)[args.skip :], args.slots)
        print("READY", flush=True)
        # Idle like an engine with no requests: the server's driver thread answers peers.
        stop.wait()
    sys.exit(0)


if __name__ == "__main__":
    main()
