"""``kvtier plan`` within ``--memory-budget``: peak memory beside the trace's size. Prints JSON.

Each case plans a trace with ``python -m kvtier.cli plan`` in a child process, and its peak RSS
is ``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a wrapper process that runs only it:

* ``mix``: a ~``--trace-mb`` MB synthetic trace (``kvtier trace synth --kind mix``, pieces of
  800,000 requests with seeds 0, 1, ..., each piece's times after the last), planned within
  ``--budget``;
* ``refused``: the same trace within ``--small-budget``, too small for it: refused as it is read;
* ``huge_lines``: issue 25's case, ``--huge-mb`` MB of 12 MiB lines (each parsed, then skipped:
  its chunks do not match its prompt_tokens) around four good requests;
* ``baseline``: the interpreter alone (a 100-request trace).

With ``--baseline-src DIR`` (the ``src`` of another checkout, e.g. a git worktree of an older
commit), ``mix`` and ``huge_lines`` are also planned by that code, without ``--memory-budget``
(the reader before it parsed 4,096 lines at once). Traces go to a temporary directory under
``--dir``, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvtier.plan.synth import SynthSpec, write

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
PIECE_REQUESTS = 800_000
#: Runs its arguments as its only child; prints the exit status and the child's peak RSS (KiB).
MEASURE = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, "
    "text=True); print(json.dumps([r.returncode, "
    "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.stderr[-600:]]))"
)


def synth_trace(path: Path, target_bytes: int) -> None:
    """A mix trace of at least ``target_bytes``: synth pieces, headers after the first dropped
    and times shifted so that each piece follows the last."""
    offset = 0.0
    with open(path, "wb") as out:
        for seed in range(1 << 10):
            piece = path.with_suffix(f".{seed}")
            with open(piece, "wb") as part:
                write(SynthSpec(requests=PIECE_REQUESTS, seed=seed), part)
            offset = _append(piece, out, offset, first=seed == 0)
            piece.unlink()
            if out.tell() >= target_bytes:
                return


def _append(piece: Path, out, offset: float, first: bool) -> float:  # type: ignore[no-untyped-def]
    """Append ``piece`` to ``out`` with ``offset`` added to every time; the last time."""
    t = offset
    with open(piece, "rb") as lines:
        header = lines.readline()
        if first:
            out.write(header)
        for line in lines:
            comma = line.index(b",")
            t = float(line[5:comma]) + offset
            out.write(b'{"t":%.4f' % t + line[comma:])
    return t


def huge_trace(path: Path, target_bytes: int) -> None:
    """12 MiB lines that parse but are skipped, between four good requests."""
    keys = (12 * MiB) // 19
    bad = b'{"t":1,"prompt_tokens":16,"chunks":[' + b",".join([b'"0123456789abcdef"'] * keys)
    good = [
        b'{"t":%d,"prompt_tokens":40,"chunks":["%016x","%016x"]}\n' % (i, 1, i + 2)
        for i in range(4)
    ]
    with open(path, "wb") as out:
        out.write(b'{"kvtier_trace": 1, "chunk_tokens": 16}\n' + good[0] + good[1])
        while out.tell() < target_bytes:
            out.write(bad + b"]}\n")
        out.write(good[2] + good[3])


def plan(trace: Path, src: Path, budget: str | None, out: Path) -> dict[str, object]:
    """Plan ``trace`` with the kvtier in ``src``: exit status, peak RSS, seconds, error."""
    argv = [sys.executable, "-m", "kvtier.cli", "plan", str(trace), "--no-chart"]
    argv += ["--target", "vllm-cuda", "--output-dir", str(out)]
    argv += ["--memory-budget", budget] if budget else []
    env = {**os.environ, "PYTHONPATH": str(src)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", "import json; " + MEASURE, *argv],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    code, kib, err = json.loads(done.stdout)
    errors = [line for line in err.splitlines() if line.startswith("kvtier: error:")]
    return {
        "src": str(src),
        "memory_budget": budget,
        "exit_status": code,
        "peak_rss_mib": round(kib / 1024),
        "peak_rss_over_file": round(kib * 1024 / trace.stat().st_size, 2),
        "seconds": round(time.perf_counter() - started, 1),
        "error": errors[0] if errors else None,
    }


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    return done.stdout.decode().strip()


def cases(args: argparse.Namespace, root: Path) -> dict[str, object]:
    """Every case, its trace's size beside it."""
    mix, huge, tiny = root / "mix.jsonl", root / "huge.jsonl", root / "tiny.jsonl"
    synth_trace(mix, args.trace_mb * 10**6)
    huge_trace(huge, args.huge_mb * MiB)
    with open(tiny, "wb") as out:
        write(SynthSpec(requests=100), out)
    src, out = ROOT / "src", root / "out"
    runs: dict[str, object] = {
        "baseline": plan(tiny, src, None, out),
        "mix": plan(mix, src, args.budget, out),
        "refused": plan(mix, src, args.small_budget, out),
        "huge_lines": plan(huge, src, None, out),
    }
    if args.baseline_src:
        runs["mix_before"] = plan(mix, Path(args.baseline_src), None, out)
        runs["huge_lines_before"] = plan(huge, Path(args.baseline_src), None, out)
    sizes = {"mix": mix.stat().st_size, "huge_lines": huge.stat().st_size}
    return {"trace_bytes": sizes, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-mb", type=int, default=1000, help="size of the mix trace, MB")
    parser.add_argument("--huge-mb", type=int, default=380, help="size of huge_lines, MiB")
    parser.add_argument("--budget", default="8GiB", help="--memory-budget of the mix plan")
    parser.add_argument("--small-budget", default="1GiB", help="--memory-budget too small")
    parser.add_argument("--baseline-src", help="the src of another checkout to compare with")
    parser.add_argument("--dir", default=None, help="where the temporary directory goes")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kvtier-plan-memory-", dir=args.dir))
    try:
        result = cases(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result |= {"benchmark": "plan_memory", "commit": commit(), "cpus": os.cpu_count()}
    result |= {"load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(result | {"python": platform.python_version()}, indent=2))


if __name__ == "__main__":
    main()
