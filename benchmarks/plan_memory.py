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

``--cases events`` measures ``kvtier trace from-events`` the same way, on two captures:

* ``chain``: issue 25's 0.39 MiB capture: a chain of 10,000 blocks, then 10,000 stores that
  each extend its end too late to merge (each request repeats the chain: 1.9 GB of trace), no
  token ids, at the default limits and at ``--memory-budget 64MiB --max-output-bytes 32MiB``;
* ``shared``: 200,000 stores of 8 blocks on one of 100 shared 32-block prefixes, token ids
  included, 50 ms apart, at the default budget, 256 MiB and 64 MiB (the trace must not change).
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
#: Runs its arguments as its only child; prints its exit status, peak RSS (KiB) and output.
MEASURE = (
    "import json, resource, subprocess, sys; r = subprocess.run(sys.argv[1:], "
    "capture_output=True, text=True); print(json.dumps([r.returncode, "
    "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.stdout[-600:], r.stderr[-600:]]))"
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


def measure(argv: list[str], src: Path) -> dict[str, object]:
    """Run ``python -m kvtier.cli ARGV`` with the kvtier in ``src``: exit status, peak RSS,
    seconds, and its last line of output or its error line."""
    command = [sys.executable, "-m", "kvtier.cli", *argv]
    env = {**os.environ, "PYTHONPATH": str(src)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, *command],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    code, kib, out, err = json.loads(done.stdout)
    errors = [line for line in err.splitlines() if line.startswith("kvtier: error:")]
    return {
        "src": str(src),
        "exit_status": code,
        "peak_rss_mib": round(kib / 1024),
        "seconds": round(time.perf_counter() - started, 1),
        "said": errors[0] if errors else (out.strip().splitlines() or [""])[-1],
    }


def plan(trace: Path, src: Path, budget: str | None, out: Path) -> dict[str, object]:
    """Plan ``trace`` with the kvtier in ``src`` (``measure``), peak RSS over the file's size."""
    argv = ["plan", str(trace), "--no-chart", "--target", "vllm-cuda", "--output-dir", str(out)]
    result = measure(argv + (["--memory-budget", budget] if budget else []), src)
    mib = result["peak_rss_mib"]
    assert isinstance(mib, int)
    return {
        "memory_budget": budget,
        **result,
        "peak_rss_over_file": round(mib * MiB / trace.stat().st_size, 2),
    }


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    return done.stdout.decode().strip()


def plan_cases(args: argparse.Namespace, root: Path) -> dict[str, object]:
    """``kvtier plan``'s cases, the traces' sizes beside them."""
    mix, huge, tiny = root / "mix.jsonl", root / "huge.jsonl", root / "tiny.jsonl"
    synth_trace(mix, args.trace_mb * 10**6)
    huge_trace(huge, args.huge_mb * MiB)
    with open(tiny, "wb") as stream:
        write(SynthSpec(requests=100), stream)
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
    return {"trace_bytes": sizes, "plan": runs}


def chain_capture(path: Path, chain: int = 10_000, stores: int = 10_000) -> None:
    """Issue 25's capture (see the module docstring)."""
    import msgpack

    with open(path, "wb") as out:
        out.write(msgpack.packb([0.0, [_stored(list(range(1, chain + 1)), None, tokens=0)]]))
        for i in range(stores):
            store = _stored([chain + 1 + i], chain, tokens=0)
            out.write(msgpack.packb([10.0 + 2 * i, [store]]))


def shared_capture(path: Path, stores: int = 200_000) -> None:
    """Stores on 100 shared prefixes (see the module docstring)."""
    import random

    import msgpack

    rng, roots, top = random.Random(1), [], 1 << 40
    with open(path, "wb") as out:
        for _ in range(100):
            out.write(msgpack.packb([0.0, [_stored(list(range(top, top + 32)), None)]]))
            roots.append(top + 31)
            top += 32
        for i in range(stores):
            store = _stored(list(range(top, top + 8)), rng.choice(roots))
            out.write(msgpack.packb([1.0 + 0.05 * i, [store]]))
            top += 8


def _stored(hashes: list[int], parent: int | None, tokens: int = 16) -> list[object]:
    """vLLM's BlockStored event, with ``tokens`` token ids a block."""
    return ["BlockStored", hashes, parent, list(range(tokens * len(hashes))), 16, None, "GPU"]


def events_cases(args: argparse.Namespace, root: Path) -> dict[str, object]:
    """``kvtier trace from-events``'s cases, the captures' and the traces' sizes beside them."""
    chain, shared = root / "chain.msgpack", root / "shared.msgpack"
    chain_capture(chain)
    shared_capture(shared)
    tight = ["--memory-budget", "64MiB", "--max-output-bytes", "32MiB"]
    todo: dict[str, tuple[Path, list[str] | None]] = {
        "chain": (chain, []),
        "chain_tight": (chain, tight),
        "shared": (shared, []),
    }
    todo |= {f"shared_{b}": (shared, ["--memory-budget", b]) for b in ("256MiB", "64MiB")}
    if args.baseline_src:
        todo |= {"chain_before": (chain, None), "shared_before": (shared, None)}
    sizes = {"chain": chain.stat().st_size, "shared": shared.stat().st_size}
    return {"capture_bytes": sizes, "events": convert_all(todo, args.baseline_src, root)}


def convert_all(
    todo: dict[str, tuple[Path, list[str] | None]], baseline: str | None, root: Path
) -> dict[str, object]:
    """Each capture converted with its limits (``None``: by the baseline, without limits)."""
    runs: dict[str, object] = {}
    trace = root / "t.jsonl"
    for name, (capture, limits) in todo.items():
        where = Path(baseline) if limits is None and baseline else ROOT / "src"
        argv = ["trace", "from-events", str(capture), "--out", str(trace), *(limits or [])]
        result = measure(argv, where)
        size = trace.stat().st_size if trace.exists() else None
        runs[name] = result | {"trace_bytes_written": size}
        trace.unlink(missing_ok=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace-mb", type=int, default=1000, help="size of the mix trace, MB")
    parser.add_argument("--huge-mb", type=int, default=380, help="size of huge_lines, MiB")
    parser.add_argument("--budget", default="8GiB", help="--memory-budget of the mix plan")
    parser.add_argument("--small-budget", default="1GiB", help="--memory-budget too small")
    parser.add_argument("--baseline-src", help="the src of another checkout to compare with")
    parser.add_argument("--dir", default=None, help="where the temporary directory goes")
    parser.add_argument("--cases", default="plan,events", help="plan, events, or both")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kvtier-plan-memory-", dir=args.dir))
    try:
        result: dict[str, object] = {}
        for name in args.cases.split(","):
            result |= {"plan": plan_cases, "events": events_cases}[name](args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result |= {"benchmark": "plan_memory", "commit": commit(), "cpus": os.cpu_count()}
    result |= {"load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(result | {"python": platform.python_version()}, indent=2))


if __name__ == "__main__":
    main()
