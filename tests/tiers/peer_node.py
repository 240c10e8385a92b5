"""A kvtier instance in its own process that serves its host tier to peers (for the p2p tests).

``python -m tests.tiers.peer_node PORT [--store N --seed S] [--accept-stores] [--curve DIR]
[--transport tcp]``
stores N chunks (``chunk_pattern`` bytes) of the small test layout, prints ``READY <port>``, and
runs idle (never polling) until SIGTERM: the peer server's own driver answers. ``PORT`` 0: the
node picks a free port itself (another one if that is taken before it binds) and reports the
port it bound in that line. With ``--curve DIR`` it uses ``DIR/server.secret`` and allows the
client keys in ``DIR/clients``; with ``--integrity-key FILE`` it seals what it serves (and
checks what peers store) with that key file. ``--fs DIR`` adds a filesystem tier under the host
tier; chunks are stored ``--slots`` at a time, so with more chunks than slots the older ones
leave host memory and live on in that tier. The node imports the kvtier of this checkout (``tests.child_process``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading

from tests.child_process import ROOT, child_env

# isort: split
from kvtier import CacheIdentity, TieringManager
from kvtier.config import P2PTierConfig
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.peer.tier import PeerTier
from tests.conftest import (
    SMALL_LAYOUT,
    config,
    fill,
    freeze_process,
    make_keys,
    on_a_free_port,
    read_line,
)


class PeerNode:
    """Runs this module in a subprocess serving on ``port``; ``args`` are its options.

    ``port`` 0: the node binds a free port of its choice; ``port`` is that port once started.
    """

    def __init__(self, port: int = 0, *args: str) -> None:
        self.port, self.args = port, args
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> PeerNode:
        """Start the node and wait (up to ``timeout`` s) until it serves."""
        cmd = [sys.executable, "-m", "tests.tiers.peer_node", str(self.port), *self.args]
        self._proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE)
        try:
            line = read_line(self._proc, timeout, f"peer node {self.args}")
            word, port = line.split()
            assert word == b"READY", f"peer node: unexpected first line {line!r}"
        except BaseException:
            self.kill()
            raise
        self.port = int(port)
        return self

    @property
    def transport(self) -> str:
        """The node's ``serve.transport`` (``--transport``, else ``zmq``)."""
        args = list(self.args)
        return args[args.index("--transport") + 1] if "--transport" in args else "zmq"

    def tier(self, region: HostRegion, identity: CacheIdentity, **options: object) -> PeerTier:
        """A client tier of this node, over the node's transport unless ``options`` name one."""
        options = {"transport": self.transport, **options}
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

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait: the node closes its manager; returns its exit code."""
        assert self._proc is not None
        self._proc.terminate()
        try:
            code = self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"peer node did not exit within {timeout:g} s of SIGTERM"
            ) from None
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
    parser.add_argument("--integrity-key", help="the top-level integrity_key_file")
    parser.add_argument("--model", default="test/model")
    parser.add_argument("--transport", default="zmq")
    return parser.parse_args()


def serve_config(args: argparse.Namespace, port: int) -> dict[str, object]:
    serve: dict[str, object] = {
        "port": port,
        "accept_stores": args.accept_stores,
        "transport": args.transport,
    }
    if args.curve:
        serve["curve_secret_key_file"] = f"{args.curve}/server.secret"
        serve["curve_client_keys_dir"] = f"{args.curve}/clients"
    extra: dict[str, object] = {"serve": serve}
    if args.integrity_key:
        extra["integrity_key_file"] = args.integrity_key
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

    def serving(port: int) -> TieringManager:
        return TieringManager(config(args.slots, **serve_config(args, port)), identity)

    if args.port:
        manager, port = serving(args.port), args.port
    else:
        manager, port = on_a_free_port(serving)
    with manager:
        store(manager, make_keys(identity, args.store, seed=args.seed)[args.skip :], args.slots)
        print(f"READY {port}", flush=True)
        # Idle like an engine with no requests: the server's driver thread answers peers.
        stop.wait()
    sys.exit(0)


if __name__ == "__main__":
    main()


def rss_mib(pid: int) -> int:
    """The resident memory of process ``pid`` (a node's), in MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")
