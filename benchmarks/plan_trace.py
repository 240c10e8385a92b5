"""``kvtier plan`` on a large synthetic trace: how long each phase takes. Prints JSON.

Writes a ``--requests`` (default 1,000,000) request ``mix`` trace with ``kvtier trace synth``
(chat, RAG and unique prompts; ``--chunk-tokens`` per key), then plans it as ``kvtier plan``
does, timing each phase: reading the trace, the analysis (reuse by chunk size, stack distances
exact or SHARDS-sampled, LRU/admission curves, ARC miniatures, histograms), the recommendation
(host + fs curves) and the outputs (report, JSON, chart). The trace goes to ``--dir`` (the temp
dir) and is deleted afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time
from pathlib import Path

from kvtier.plan.analysis import GiB, PlanOptions, analyze
from kvtier.plan.cost import DEFAULTS
from kvtier.plan.report import text, to_json, write_chart, write_json
from kvtier.plan.synth import SynthSpec, write
from kvtier.plan.trace_read import read_trace
from kvtier.plan.verdict import recommend


def timed(phases: dict[str, float], name: str, fn):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    result = fn()
    phases[name] = round(time.perf_counter() - started, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--chunk-tokens", type=int, default=64)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kvtier-plan-bench-", dir=args.dir))
    path = root / "mix.jsonl"
    spec = SynthSpec(kind="mix", requests=args.requests, chunk_tokens=args.chunk_tokens)
    phases: dict[str, float] = {}
    with open(path, "wb") as out:
        timed(phases, "synth_s", lambda: write(spec, out))
    options = PlanOptions(device_bytes=16 * GiB, host_memory=256 * GiB)
    trace = timed(phases, "read_s", lambda: read_trace(path))
    analysis = timed(phases, "analyze_s", lambda: analyze(trace, options))
    rec = timed(phases, "recommend_s", lambda: recommend(analysis, DEFAULTS))

    def outputs() -> str:
        write_json(to_json(analysis, rec, str(path)), root / "plan.json")
        write_chart(analysis, rec, root / "plan.png", "benchmark")
        return text(analysis, rec, str(path))

    report = timed(phases, "outputs_s", outputs)
    planned = round(sum(v for k, v in phases.items() if k != "synth_s"), 2)
    print(
        json.dumps(
            {
                "benchmark": "plan_trace",
                "requests": trace.num_requests,
                "trace_chunks": trace.num_chunks,
                "trace_bytes": path.stat().st_size,
                "chunk_tokens_chosen": analysis.chunk.chunk_tokens,
                "references_analyzed": len(analysis.stream),
                "method": analysis.curves["lru"].method,
                "lru_standard_error": round(analysis.curves["lru"].error, 5),
                "arc_error": round(analysis.arc_error, 5),
                "verdict": rec.verdict,
                "plan_s": planned,
                "phases_s": phases,
                "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                "report": report.splitlines(),
                "cpus": os.cpu_count(),
                "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
                "python": platform.python_version(),
            },
            indent=2,
        )
    )
    if not args.keep:
        for file in root.iterdir():
            file.unlink()
        root.rmdir()


if __name__ == "__main__":
    main()
