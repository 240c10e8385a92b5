"""The engine benches' report (``--engine vllm``, ``--engine sglang``): rows, table, chart.

Engine-neutral: the input is a report per strategy (``{"phases": [...], "disk_bytes": {...},
"load_seconds": S}``, one phase per round and N as ``phase.py`` measures them) and a
``Counted`` that reads, from one phase, where its prompt tokens came from and how many bytes
moved per tier (each engine has its own counters). One row per (N, strategy): throughput
(prompt and generated tokens per second of the phase) and its fraction of the ``ceiling`` at
that N (when it ran), TTFT p50/p95/p99 and inter-token latency p50/p99 of the conversation
requests, the one-shots' TTFT apart (``--mix``), prompt tokens by source (the rest
``computed``), bytes moved per tier, and the fraction of requests whose greedy answer equals
``recompute``'s (``None`` when recompute did not run). ``same_run_ratios`` compares two
strategies round by round and N by N.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.bench import pair_verdict

CEILING, RECOMPUTE = "ceiling", "recompute"
#: ``(phase, prompt tokens) -> (prompt tokens by source, bytes moved by tier)``.
Counted = Callable[[dict[str, Any], int], tuple[dict[str, int], dict[str, int]]]


def percentiles_ms(
    seconds: list[float], points: tuple[int, ...] = (50, 95, 99)
) -> dict[str, float]:
    if not seconds:
        return {f"p{p}": 0.0 for p in points}
    values = np.percentile(np.asarray(seconds) * 1000, points)
    return {f"p{p}": round(float(v), 2) for p, v in zip(points, values, strict=True)}


def summarize(
    strategy: str,
    phase: dict[str, Any],
    reference: dict[str, Any] | None,
    disk_bytes: int | None,
    counted: Counted,
) -> dict[str, Any]:
    """One row (see the module docstring); ``reference``: recompute's phase at the same N."""
    requests = phase["requests"]
    talks = [r for r in requests if not r["one_shot"]]
    prompt = sum(r["prompt_tokens"] for r in requests)
    tokens = prompt + sum(len(r["tokens"]) for r in requests)
    cpu = phase.get("cpu_seconds")
    sources, moved = counted(phase, prompt)
    row: dict[str, Any] = {
        "round": phase.get("round", 0),
        "conversations": phase["conversations"],
        "strategy": strategy,
        "throughput_tok_s": round(tokens / phase["seconds"], 1),
        "fraction_of_ceiling": None,
        "seconds": round(phase["seconds"], 3),
        "settle_seconds": _rounded(phase.get("settle_seconds")),
        "cpu_ms_per_request": None if cpu is None else round(cpu * 1000 / len(requests), 2),
        "tokens": tokens,
        "requests": len(requests),
        "ttft_ms": percentiles_ms([r["ttft_s"] for r in talks]),
        "itl_ms": percentiles_ms([g for r in talks for g in r["itl_s"]], (50, 99)),
        "prompt_tokens_from": sources,
        "bytes": moved,
        "disk_bytes_after_run": disk_bytes,
        "answers_equal_to_recompute": equal_fraction(requests, reference),
    }
    shots = [r["ttft_s"] for r in requests if r["one_shot"]]
    if shots:
        row["one_shot_ttft_ms"] = percentiles_ms(shots)
    return row


def _rounded(seconds: float | None) -> float | None:
    """``phase.settle_writes``' wait, or ``None`` from a runner that did not settle."""
    return None if seconds is None else round(seconds, 3)


def equal_fraction(requests: list[dict[str, Any]], reference: dict[str, Any] | None) -> Any:
    if reference is None:
        return None
    expected = {r["key"]: r["tokens"] for r in reference["requests"]}
    same = [expected.get(r["key"]) == r["tokens"] for r in requests]
    return round(sum(same) / len(same), 4) if same else None


def rows(reports: dict[str, dict[str, Any]], counted: Counted) -> list[dict[str, Any]]:
    """Rows by round and N, then strategy in run order; fractions of the ceiling (the
    ceiling's of the same round and N) filled in."""
    table = []
    recompute = reports.get(RECOMPUTE)
    for i in range(len(next(iter(reports.values()))["phases"])):
        at = []
        for strategy, report in reports.items():
            ref = recompute["phases"][i] if recompute is not None else None
            disk = report["disk_bytes"].get(strategy)
            at.append(summarize(strategy, report["phases"][i], ref, disk, counted))
        ceiling = next((r for r in at if r["strategy"] == CEILING), None)
        for row in at:
            if ceiling is not None:
                row["fraction_of_ceiling"] = round(
                    row["throughput_tok_s"] / ceiling["throughput_tok_s"], 3
                )
        table += at
    return table


def same_run_ratios(table: list[dict[str, Any]], mine: str, other: str) -> list[dict[str, Any]]:
    """Per round and N where both ran: ``mine`` over ``other`` in throughput, TTFT p99 and p50
    and (``None`` without it) CPU time per request."""
    out = []
    for turn, n in sorted({(row["round"], row["conversations"]) for row in table}):
        at = {r["strategy"]: r for r in table if (r["round"], r["conversations"]) == (turn, n)}
        if mine in at and other in at:
            k, v = at[mine], at[other]
            out.append(
                {
                    "round": turn,
                    "conversations": n,
                    "throughput_ratio": ratio(k["throughput_tok_s"], v["throughput_tok_s"]),
                    "ttft_p99_ratio": ratio(k["ttft_ms"]["p99"], v["ttft_ms"]["p99"]),
                    "ttft_p50_ratio": ratio(k["ttft_ms"]["p50"], v["ttft_ms"]["p50"]),
                    "cpu_ratio": cpu_ratio(k, v),
                    "disk_bytes": {
                        mine: k["disk_bytes_after_run"],
                        other: v["disk_bytes_after_run"],
                    },
                }
            )
    return out


def ratio(mine: float | None, other: float | None) -> float | None:
    """``mine / other`` to 3 places; ``None`` (no ratio, left out of a verdict) when either is
    missing or not finite, or ``other`` is not positive (a phase that served nothing)."""
    if mine is None or other is None or not (math.isfinite(mine) and math.isfinite(other)):
        return None
    return round(mine / other, 3) if other > 0 else None


def cpu_ratio(mine: dict[str, Any], other: dict[str, Any]) -> float | None:
    """``mine``'s CPU time per request over ``other``'s; ``None`` when either lacks it."""
    return ratio(mine.get("cpu_ms_per_request"), other.get("cpu_ms_per_request"))


def pair_lines(ratios: list[dict[str, Any]], name: str) -> list[str]:
    """One terminal line per round (when there are several) and N of ``same_run_ratios``."""
    repeated = any(item["round"] for item in ratios)
    return [
        ("round {} ".format(item["round"] + 1) if repeated else "")
        + f"N={item['conversations']}: {name} throughput "
        f"{_times(item['throughput_ratio'])}, TTFT p99 {_times(item['ttft_p99_ratio'])}"
        for item in ratios
    ]


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def format_table(table: list[dict[str, Any]]) -> str:
    """The terminal table: one line per (N, strategy), per round when there are several."""
    names = sorted({s for row in table for s in row["prompt_tokens_from"]} - {"computed"})
    names.append("computed")
    wide = max(10, *(len(row["strategy"]) for row in table))
    repeated = any(row.get("round") for row in table)
    head = (
        ("round " if repeated else "")
        + f"{'N':>4} {'strategy':<{wide}} {'tok/s':>7} {'of best':>7} {'TTFT p50':>9} {'p95':>8} "
        f"{'p99':>8} {'ITL p50':>8} {'p99':>7} {'CPU/req':>9} {'same':>5} "
        + " ".join(f"{s[:8]:>8}" for s in names)
    )
    mixed = any("one_shot_ttft_ms" in row for row in table)
    head += f" {'one-shot TTFT':>17}" if mixed else ""
    lines = [head, "-" * len(head)]
    for row in table:
        t, i, share = row["ttft_ms"], row["itl_ms"], row["fraction_of_ceiling"]
        prompt = sum(row["prompt_tokens_from"].values()) or 1
        same, cpu = row["answers_equal_to_recompute"], row.get("cpu_ms_per_request")
        lines.append(
            (f"{row['round'] + 1:>5} " if repeated else "")
            + f"{row['conversations']:>4} {row['strategy']:<{wide}} "
            f"{row['throughput_tok_s']:>7.0f} "
            f"{'-' if share is None else format(share, '.0%'):>7} {t['p50']:>7.1f}ms "
            f"{t['p95']:>6.1f}ms {t['p99']:>6.1f}ms {i['p50']:>6.1f}ms {i['p99']:>5.1f}ms "
            f"{'-' if cpu is None else format(cpu, '.1f') + 'ms':>9} "
            f"{'-' if same is None else format(same, '.0%'):>5} "
            + " ".join(f"{row['prompt_tokens_from'].get(s, 0) / prompt:>8.0%}" for s in names)
            + _one_shots(row)
        )
    lines.append(
        "CPU/req: CPU time of the engine's processes per request; same: answers equal to "
        "recompute's; then where prompt tokens came from"
        + ("; then the one-shots' TTFT p50/p99 (--mix)." if mixed else ".")
    )
    return "\n".join(lines)


def _one_shots(row: dict[str, Any]) -> str:
    shots = row.get("one_shot_ttft_ms")
    return f" {shots['p50']:>7.1f}/{shots['p99']:>7.1f}ms" if shots else ""


def header(options: Any, reports: dict[str, Any]) -> dict[str, Any]:
    """The report's run description: options, engine load times, load average."""
    opts = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(options).items()}
    return {
        "options": opts,
        "engine_load_seconds": {s: round(r["load_seconds"], 1) for s, r in reports.items()},
        "load_average_1m": {s: r.get("load_average_1m") for s, r in reports.items()},
    }


#: Drawn only when a ceiling ran: without one there is no fraction of it.
FRACTION_PANEL = (
    "Fraction of the ceiling", "of ceiling", lambda row: row["fraction_of_ceiling"] or 0.0
)  # fmt: skip
PANELS: list[tuple[str, str, Any]] = [
    ("Throughput", "tokens / s", lambda row: row["throughput_tok_s"]),
    FRACTION_PANEL,
    ("TTFT p50", "ms", lambda row: row["ttft_ms"]["p50"]),
    ("TTFT p99 (tails break SLOs)", "ms", lambda row: row["ttft_ms"]["p99"]),
]  # fmt: skip


def median_by_n(table: list[dict[str, Any]], strategy: str, value: Any) -> list[float]:
    """``value`` of ``strategy``'s rows per N (ascending), the median over the rounds."""
    sizes = sorted({row["conversations"] for row in table if row["strategy"] == strategy})
    return [
        float(
            np.median(
                [value(r) for r in table if (r["strategy"], r["conversations"]) == (strategy, n)]
            )
        )
        for n in sizes
    ]


def write_chart(
    table: list[dict[str, Any]],
    title: str,
    path: Path,
    items: list[dict[str, Any]] | None = None,
    pair: str = "",
) -> None:
    """Four panels against conversations, one line per strategy (the median over the rounds);
    with ``items`` (``pair_verdict.verdicts``), a fifth: ``pair``'s ratios with intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({row["conversations"] for row in table})
    strategies = list(dict.fromkeys(row["strategy"] for row in table))
    shown = [p for p in PANELS if p is not FRACTION_PANEL or CEILING in strategies]
    panels = len(shown) + (1 if items else 0)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.8))
    for axis, (name, unit, value) in zip(axes, shown, strict=False):
        for strategy in strategies:
            axis.plot(
                sorted({r["conversations"] for r in table if r["strategy"] == strategy}),
                median_by_n(table, strategy, value),
                "--" if strategy == CEILING else "-",
                marker="o",
                label=strategy,
            )
        axis.set(title=name, xlabel="conversations", ylabel=unit, xscale="log")
        axis.set_xticks(sizes, [str(n) for n in sizes])
        axis.minorticks_off()
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    axes[0].legend(loc="lower left")
    if items:
        pair_verdict.plot_intervals(axes[-1], items, pair)
        axes[-1].set_xticks(sizes, [str(n) for n in sizes])
        axes[-1].minorticks_off()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
