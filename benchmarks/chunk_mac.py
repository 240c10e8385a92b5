"""Sealing chunks: candidate constructions, and the fs tier sealed, against today's unkeyed xxh3
path measured in the same run (issue 25). Prints JSON.

Part 1, ``primitives``: each candidate over a payload already in memory (hot), one thread, for
chunks of 256 KiB, 2 MiB and 8 MiB: GB/s (payload bytes per second, GB = 1e9) and CPU µs per
chunk, best of ``--repeats`` rounds (the candidates' rounds interleaved), and ``ratio``, its
time per chunk over xxh3-128's:

* ``xxh3_128``: today's checksum (unkeyed: whoever writes the medium can compute it);
* ``blake3_keyed`` (when the ``blake3`` package is installed), ``blake2b_keyed`` (hashlib),
  ``hmac_sha256`` (hashlib): keyed MACs over the payload;
* ``aes256gcm_tag``: AES-256-GCM with the payload as associated data (GMAC), under a key
  derived per chunk with HMAC-SHA256, as kvtier seals without ``encrypt``;
* ``aes256gcm_encrypt``: the same, the payload encrypted in place (kvtier's ``encrypt``);
* ``chacha20poly1305``: cryptography's one-shot AEAD (it allocates its output).

Part 2, ``fs_tier``: kvtier's own path, ``ChunkFiles`` (the fs tier's chunk files: header,
sealing, the compiled or os-module I/O, verification into a host slot), for the modes ``none``
(xxh3, today), ``mac`` and ``mac_encrypt``: ``store`` (write + seal), ``hot_load`` (the file in
the page cache) and ``cold_load`` (each file's pages dropped with ``posix_fadvise(DONTNEED)``
after an ``fdatasync``; needs no root, only a file one can open; ``cachestat``, where the
kernel has it, confirms how many files were out of the cache). One thread, so CPU per chunk is
the path's own; ``ratio`` is each mode's time per chunk over ``none``'s. The chunks' two levels
of directories are made before timing, as in a cache in use (a ``mkdir`` is not sealing).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from kvtier import CacheIdentity, ChunkKey, KVLayout
from kvtier.region import HostRegion
from kvtier.tiers.fs.files import ChunkFiles
from kvtier.tiers.fs.page_cache import CACHESTAT
from kvtier.tiers.shared.sealing import Sealer, make_sealer

SIZES = (256 << 10, 2 << 20, 8 << 20)
IDENTITY = CacheIdentity(model="bench/model", layout=KVLayout(1, 1, 64))
KEY = bytes(range(32))
Timing = tuple[float, float]  # (wall seconds, CPU seconds of the process) per chunk


def per_call(n: int, fn: Callable[[], Any]) -> Timing:
    """Wall and CPU time per call of ``fn`` over ``n`` calls."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - wall) / n, (time.process_time() - cpu) / n


def best(timings: list[Timing]) -> Timing:
    """The best wall and the best CPU time of several rounds (each its own minimum)."""
    return min(t[0] for t in timings), min(t[1] for t in timings)


def figures(size: int, timing: Timing, baseline: Timing) -> dict[str, float]:
    wall, cpu = timing
    return {
        "GBps": round(size / wall / 1e9, 3),
        "cpu_us_per_chunk": round(cpu * 1e6, 1),
        "ratio": round(wall / baseline[0], 2),
    }


# -- part 1: primitives -----------------------------------------------------------------------
def candidates(payload: memoryview) -> dict[str, Callable[[], Any]]:
    salt, nonce = os.urandom(32), bytes(12)

    def gcm(encrypt: bool) -> bytes:
        subkey = hmac.digest(KEY, b"kvtier chunk v2 aes-256-gcm\0" + salt, "sha256")
        sealing = Cipher(algorithms.AES(subkey), modes.GCM(nonce)).encryptor()
        sealing.authenticate_additional_data(b"h" * 128)
        if encrypt:
            sealing.update_into(payload, payload)
        else:
            sealing.authenticate_additional_data(payload)
        sealing.finalize()
        return sealing.tag

    found: dict[str, Callable[[], Any]] = {"xxh3_128": lambda: xxhash.xxh3_128_digest(payload)}
    try:
        import blake3  # type: ignore[import-not-found]

        found["blake3_keyed"] = lambda: blake3.blake3(payload, key=KEY).digest()
    except ImportError:
        pass
    found["blake2b_keyed"] = lambda: hashlib.blake2b(payload, key=KEY).digest()
    found["hmac_sha256"] = lambda: hmac.digest(KEY, payload, "sha256")
    found["aes256gcm_tag"] = lambda: gcm(False)
    found["aes256gcm_encrypt"] = lambda: gcm(True)
    found["chacha20poly1305"] = lambda: ChaCha20Poly1305(KEY).encrypt(nonce, payload, None)
    return found


def primitives(size: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Rounds of the candidates interleaved, so that a burst of load elsewhere does not fall
    on one candidate only; the best round of each."""
    payload = memoryview(bytearray(np.random.default_rng(size).bytes(size)))
    n = max(3, (args.primitive_mib << 20) // size)
    found = candidates(payload)
    rounds: dict[str, list[Timing]] = {name: [] for name in found}
    for _ in range(args.repeats):
        for name, fn in found.items():
            rounds[name].append(per_call(n, fn))
    timings = {name: best(r) for name, r in rounds.items()}
    return {name: figures(size, t, timings["xxh3_128"]) for name, t in timings.items()}


# -- part 2: the fs tier ----------------------------------------------------------------------
def sealers(root: Path) -> dict[str, Sealer]:
    key_file = root / "chunks.key"
    key_file.write_text(KEY.hex() + "\n")
    key_file.chmod(0o600)
    return {
        "none": make_sealer(None),
        "mac": make_sealer(str(key_file)),
        "mac_encrypt": make_sealer(str(key_file), encrypt=True),
    }


def drop_from_cache(paths: list[Path]) -> int:
    """Drop each file's pages (``fdatasync`` first: dirty pages stay); how many are out."""
    out = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            pages = CACHESTAT.cached_pages(fd) if CACHESTAT.available else None
            out += pages == 0
        finally:
            os.close(fd)
    return out


def _with_region(pair: tuple[ChunkKey, int], region: HostRegion) -> tuple[Any, ...]:
    return pair[0], region, pair[1]


def fs_round(files: ChunkFiles, region: HostRegion, keys: list[ChunkKey]) -> dict[str, Any]:
    """Store, hot load and cold load of every slot, one thread; per-chunk timings."""
    slots = range(len(keys))

    def each(fn: Callable[[ChunkKey, HostRegion, int], object]) -> Timing:
        pairs = iter(list(zip(keys, slots, strict=True)))
        return per_call(len(keys), lambda: fn(*_with_region(next(pairs), region)))

    store = each(files.write)
    each(files.reader.read)  # into the page cache, whatever the store did
    hot = each(files.reader.read)
    paths = [Path(files.namespace) / k.hex()[:2] / k.hex()[2:4] / k.hex() for k in keys]
    dropped = drop_from_cache(paths)
    cold = each(files.reader.read)
    return {"store": store, "hot_load": hot, "cold_load": cold, "dropped": dropped}


def fs_tier(size: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Rounds of the three modes interleaved; the best round of each, per operation."""
    n = max(4, (args.fs_mib << 20) // size)
    region = HostRegion(n, size, pin=False)
    for slot in range(n):
        region.numpy(slot)[:] = np.random.default_rng(slot).integers(0, 256, size, dtype=np.uint8)
    modes = sealers(scratch)
    rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for _ in range(args.repeats):
        for mode, sealer in modes.items():
            root = Path(tempfile.mkdtemp(dir=scratch))
            files = ChunkFiles(str(root), IDENTITY, sealer=sealer)
            try:
                keys = [ChunkKey(os.urandom(32)) for _ in range(n)]
                for key in keys:  # as in a cache in use: its level directories exist
                    os.makedirs(Path(files.namespace, key.hex()[:2], key.hex()[2:4]), exist_ok=True)
                rounds[mode].append(fs_round(files, region, keys))
            finally:
                files.close()
                shutil.rmtree(root)
    ops = ("store", "hot_load", "cold_load")
    bests = {mode: {op: best([r[op] for r in rs]) for op in ops} for mode, rs in rounds.items()}
    return {
        mode: {op: figures(size, bests[mode][op], bests["none"][op]) for op in ops}
        | {"cold_files_dropped": f"{min(r['dropped'] for r in rounds[mode])}/{n}"}
        for mode in modes
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--primitive-mib", type=int, default=256, help="hashed per round")
    parser.add_argument("--fs-mib", type=int, default=64, help="stored and loaded per round")
    parser.add_argument("--dir", default=None, help="where the fs part writes (default: tmp)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="kvtier-chunk-mac-", dir=args.dir))
    try:
        report = {
            "machine": machine(),
            "primitives": {str(size): primitives(size, args) for size in SIZES},
            "fs_tier": {str(size): fs_tier(size, args, scratch) for size in SIZES},
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(report, indent=1))


def machine() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for package in ("cryptography", "xxhash", "blake3"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
        "cachestat": CACHESTAT.available,
        "cold_method": "fdatasync + posix_fadvise(POSIX_FADV_DONTNEED) per file (no root)",
    }


if __name__ == "__main__":
    main()
