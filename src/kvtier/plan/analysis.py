"""Everything measured from a trace, before any recommendation: reuse by chunk size, the
chosen chunk size's stack distances (exact or sampled), the LRU, LRU + admission and ARC
curves, and the reuse-distance histograms.

``analyze(trace, options)`` runs on the caller's thread. Its cost is dominated by the stack
distances (vectorized, at most ``options.exact_limit`` references per run, so larger traces
are sampled) and the ARC simulations (``options.arc_points`` capacities on a miniature of at
most ``options.arc_limit`` references).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvtier.plan.cost import PlanInputError
from kvtier.plan.curves import (
    Curve,
    admitted_samples,
    capacity_grid,
    miniature,
    policy_curve,
    stack_curve,
)
from kvtier.plan.reuse import (
    ChunkReuse,
    Histograms,
    histograms,
    pick_chunk_size,
    reuse_by_chunk_size,
)
from kvtier.plan.stack import Sample, Stream, build_stream, measure, samples
from kvtier.plan.trace import Trace

MiB, GiB, TiB = 1 << 20, 1 << 30, 1 << 40
#: Llama-3-8B in bfloat16: 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes.
LLAMA3_8B_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
#: Bytes the filesystem tier adds to each chunk file (its header).
FILE_HEADER_BYTES = 4096


@dataclass(frozen=True)
class PlanOptions:
    """The model, the machine and the analysis budget (defaults: Llama-3-8B, 16 GiB of
    accelerator KV pool, 8 GiB for the serving process, at most 2 TiB of disk)."""

    bytes_per_token: int = LLAMA3_8B_BYTES_PER_TOKEN
    engine_block_size: int = 16
    chunk_tokens: int | None = None
    max_chunk_tokens: int = 1024
    max_chunk_bytes: int = 64 * MiB
    device_bytes: int = 16 * GiB
    host_memory: int | None = None
    #: The most ``cpu_bytes_to_use`` may be whatever the headroom (``None``: no cap), and why
    #: (the CLI caps it at half of this machine's memory, so the printed line starts here).
    max_cpu_bytes: int | None = None
    max_cpu_reason: str = "--max-cpu-bytes"
    process_bytes: int = 8 * GiB
    page_cache_bytes: int | None = None
    max_fs_bytes: int = 2 * TiB
    exact_limit: int = 2_000_000
    arc_limit: int = 50_000
    arc_points: int = 6
    min_reuse: float = 0.05
    min_gain: float = 0.02
    knee: float = 0.95


@dataclass
class Analysis:
    """What the trace shows at the chosen chunk size (``chunk``)."""

    trace: Trace
    options: PlanOptions
    by_chunk_size: list[ChunkReuse]
    chunk: ChunkReuse
    stream: Stream
    samples: list[Sample]
    admitted: list[Sample]
    total_tokens: float
    curves: dict[str, Curve] = field(default_factory=dict)
    histograms: Histograms | None = None
    arc_error: float = 0.0

    @property
    def chunk_bytes(self) -> int:
        return self.chunk.chunk_tokens * self.options.bytes_per_token

    @property
    def device_chunks(self) -> int:
        return self.options.device_bytes // self.chunk_bytes

    @property
    def slot_bytes(self) -> int:
        """Host memory per chunk (slots are rounded up to 4 KiB)."""
        return -(-self.chunk_bytes // 4096) * 4096


def analyze(trace: Trace, options: PlanOptions) -> Analysis:
    """Measure ``trace`` (see the module docstring)."""
    options_by_size = reuse_by_chunk_size(
        trace, max(options.max_chunk_tokens, trace.chunk_tokens), options.engine_block_size
    )
    chunk = _chosen(options_by_size, options, trace)
    stream = build_stream(trace, chunk.chunk_tokens // trace.chunk_tokens)
    measured = samples(stream, options.exact_limit)
    analysis = Analysis(
        trace,
        options,
        options_by_size,
        chunk,
        stream,
        measured,
        admitted_samples(measured),
        float(max(1, trace.prompt_tokens.sum())),
    )
    top = max([float(np.max(s.distances[np.isfinite(s.distances)], initial=1.0)) for s in measured])
    grid = capacity_grid(max(top, analysis.device_chunks))
    analysis.curves["lru"] = stack_curve("LRU", measured, grid, analysis.total_tokens)
    analysis.curves["lru_admit"] = stack_curve(
        "LRU + second-use admission", analysis.admitted, grid, analysis.total_tokens
    )
    _policy_curves(analysis, grid)
    analysis.histograms = histograms(measured, trace.times, analysis.chunk_bytes)
    return analysis


def _chosen(options_by_size: list[ChunkReuse], options: PlanOptions, trace: Trace) -> ChunkReuse:
    if options.chunk_tokens is not None:
        forced = [o for o in options_by_size if o.chunk_tokens == options.chunk_tokens]
        if not forced:
            sizes = ", ".join(str(o.chunk_tokens) for o in options_by_size)
            raise PlanInputError(
                f"--chunk-tokens {options.chunk_tokens}: this trace allows {sizes} "
                f"(power-of-two multiples of its {trace.chunk_tokens}-token chunks)"
            )
        return forced[0]
    return pick_chunk_size(options_by_size, options.bytes_per_token, options.max_chunk_bytes)


def _policy_curves(analysis: Analysis, grid: np.ndarray) -> None:
    """ARC with and without admission on a miniature; the error of the miniature estimated by
    LRU on the same miniature against the full LRU curve."""
    options = analysis.options
    mini, rate = miniature(analysis.stream, options.arc_limit)
    points = np.unique(np.round(np.geomspace(grid[0], grid[-1], options.arc_points)))
    points = points.astype(np.int64)
    total_usable = int(analysis.stream.usable.sum())
    total = (analysis.total_tokens, total_usable)
    for key, name, admission in (
        ("arc", "ARC", False),
        ("arc_admit", "ARC + second-use admission", True),
    ):
        analysis.curves[key] = policy_curve(name, mini, rate, "arc", admission, points, total)
    if rate < 1.0:
        mini_lru = stack_curve(
            "LRU", [measure(mini, rate, total_usable)], points, analysis.total_tokens
        )
        full = np.array([analysis.curves["lru"].at(p) for p in points])
        analysis.arc_error = float(np.abs(mini_lru.hit - full).max())
        for key in ("arc", "arc_admit"):
            analysis.curves[key].error = analysis.arc_error
