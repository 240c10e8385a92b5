"""kvtier cache ls, du, gc and verify at scale; prints JSON (no pass/fail: see docs/performance).

* ``ls``/``du``/``gc --max-bytes``: ``--files`` (1,000,000) tiny chunk files with valid names
  under two identities (made once under ``--dir``, kept for reruns). Each command runs in its
  own process; its wall time, CPU time (user + system: what a loaded machine does not
  inflate) and peak RSS (``ru_maxrss``) are reported. ``gc`` bounds the
  directory to half its bytes (``--gc-dry-run`` decides without deleting).
* ``verify``: ``--verify-mib`` of real 8 MiB chunks, cold (``posix_fadvise DONTNEED`` on every
  file before each run), read by ``cat`` (one process per 256 files) and by ``kvtier cache
  verify --jobs N``, in the same run; the ratio is verify's rate over cat's.

    python benchmarks/cache_ops.py --dir /var/tmp/kvbench [--files 1000000] [--verify-mib 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cache.cache_tree import FsCache, chain, make_identity

CHILD = """
import json, resource, sys, time
from kvtier.cli.main import main
start = time.perf_counter()
code = main(sys.argv[1:])
seconds = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
peak, cpu = usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime
report = {"code": code, "seconds": seconds, "cpu_seconds": cpu, "peak_rss_bytes": peak}
print(json.dumps(report), file=sys.stderr)
"""


def many_files(root: Path, n: int) -> None:
    """``n`` empty chunk files under two identities (skipped when ``root`` has them)."""
    done = root / ".made"
    if done.exists() and int(done.read_text()) == n:
        return
    cache = FsCache(root)
    for i, model in enumerate(("bench/a", "bench/b")):
        identity = make_identity(model)
        ns, made = cache.namespace(identity), set()
        for key in chain(identity, n // 2, seed=i):
            name = key.hex()
            level = ns / name[:2] / name[2:4]
            if name[:4] not in made:
                level.mkdir(parents=True, exist_ok=True)
                made.add(name[:4])
            os.close(os.open(level / name, os.O_CREAT | os.O_WRONLY, 0o600))
    done.write_text(str(n))


def run_child(argv: list[str]) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, check=False
    )
    return dict(json.loads(done.stderr.strip().splitlines()[-1]))


def cold(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def verify_rate(root: Path, mib: int, jobs: int) -> dict[str, float]:
    cache = FsCache(root)
    identity = make_identity("bench/verify")
    n = max(1, mib // 8)
    if not (root / ".made").exists():
        cache.write_chain(identity, chain(identity, n), size=8 << 20)
        (root / ".made").write_text(str(n))
    files = sorted(p for p in root.rglob("*") if len(p.name) == 64 and p.is_file())
    nbytes = sum(p.stat().st_size for p in files)
    cold(files)
    start = time.perf_counter()
    for i in range(0, len(files), 256):
        subprocess.run(
            ["cat", *map(str, files[i : i + 256])], stdout=subprocess.DEVNULL, check=True
        )
    cat_s = time.perf_counter() - start
    cold(files)
    result = run_child(["cache", "verify", str(root), "--jobs", str(jobs), "--progress", "none"])
    return {
        "bytes": nbytes,
        "cat_mib_s": nbytes / cat_s / 2**20,
        "verify_mib_s": nbytes / result["seconds"] / 2**20,
        "ratio": cat_s / result["seconds"],
        "verify_peak_rss_bytes": result["peak_rss_bytes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--verify-mib", type=int, default=2048)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--gc-dry-run", action="store_true")
    parser.add_argument("--skip", nargs="*", default=[], choices=["many", "verify"])
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    report: dict[str, object] = {"commit": commit.stdout.strip(), "cpus": os.cpu_count()}
    if "many" not in args.skip:
        root = args.dir / "many"
        start = time.perf_counter()
        many_files(root, args.files)
        report["files"] = args.files
        report["make_s"] = time.perf_counter() - start
        for command in ("ls", "du"):
            report[command] = run_child(["cache", command, str(root), "--json"])
        gc = ["cache", "gc", str(root), "--max-bytes", "0"] + (
            ["--dry-run"] if args.gc_dry_run else []
        )
        report["gc_max_bytes"] = run_child(gc)
    if "verify" not in args.skip:
        report["verify"] = verify_rate(args.dir / "verify", args.verify_mib, args.jobs)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
