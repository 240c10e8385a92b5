"""Reports of ``kvtier bench``: a terminal table, a JSON file and a PNG chart.

Every strategy is also read as a fraction of the ``ceiling`` run at the same N. ``headline``
picks the figures of the largest N: the fullest tiered strategy's throughput over recompute and
as a fraction of the ceiling, and TTFT p50 of follow-up turns (a long cached prefix) against
recompute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kvtier.bench.engine import RunResult
from kvtier.bench.runner import CEILING, HOST, RECOMPUTE, Sweep
from kvtier.integrations.transformers import ACCELERATOR, RECOMPUTED


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0}
    values = np.percentile(np.asarray(seconds) * 1000, [50, 95, 99])
    return {name: round(float(v), 2) for name, v in zip(("p50", "p95", "p99"), values, strict=True)}


def summarize(result: RunResult, ceiling: RunResult | None) -> dict[str, Any]:
    """One row: throughput, fraction of the ceiling, TTFT, token sources, output agreement."""
    return {
        "conversations": result.num_conversations,
        "strategy": result.strategy,
        **measured(result),
        "fraction_of_ceiling": ratio(result.throughput, ceiling),
        "answers_equal_to_ceiling": agreement(result, ceiling),
    }


def measured(result: RunResult) -> dict[str, Any]:
    """The columns every bench table shares: throughput, time, TTFT, prompt-token sources."""
    prompt_tokens = sum(result.sources.values()) or 1
    return {
        "throughput_tok_s": round(result.throughput, 1),
        "seconds": round(result.seconds, 3),
        "tokens": result.tokens,
        "ttft_ms": percentiles_ms(result.ttft_s),
        "follow_up_ttft_ms": percentiles_ms(result.follow_up_ttft_s),
        "prompt_tokens_from": dict(result.sources),
        "prompt_fraction_from": {k: round(v / prompt_tokens, 4) for k, v in result.sources.items()},
    }


def ratio(throughput: float, reference: RunResult | None) -> float | None:
    """``throughput`` over the reference run's, or ``None`` without one."""
    reference_tps = reference.throughput if reference is not None else 0.0
    return round(throughput / reference_tps, 3) if reference_tps else None


def agreement(result: RunResult, reference: RunResult | None) -> float | None:
    """The share of the reference run's answers this run gave too."""
    same = [result.outputs[k] == v for k, v in reference.outputs.items()] if reference else []
    return round(sum(same) / len(same), 4) if same else None


def rows(sweep: Sweep) -> list[dict[str, Any]]:
    ceilings = {r.num_conversations: r for r in sweep.results if r.strategy == CEILING}
    return [summarize(r, ceilings.get(r.num_conversations)) for r in sweep.results]


def headline(sweep: Sweep, table: list[dict[str, Any]]) -> dict[str, Any]:
    largest = max(row["conversations"] for row in table)
    at = {row["strategy"]: row for row in table if row["conversations"] == largest}
    tiered, recompute = at[sweep.strategies[2]], at[RECOMPUTE]
    return {
        "conversations": largest,
        "strategy": tiered["strategy"],
        "throughput_over_recompute": round(
            tiered["throughput_tok_s"] / recompute["throughput_tok_s"], 2
        ),
        "fraction_of_ceiling": tiered["fraction_of_ceiling"],
        "follow_up_ttft_p50_ms": tiered["follow_up_ttft_ms"]["p50"],
        "recompute_follow_up_ttft_p50_ms": recompute["follow_up_ttft_ms"]["p50"],
    }


def source_columns(table: list[dict[str, Any]]) -> list[str]:
    seen = {name for row in table for name in row["prompt_tokens_from"]}
    tiers = sorted(seen - {ACCELERATOR, HOST, RECOMPUTED})
    return [ACCELERATOR, HOST, *tiers, RECOMPUTED]


def format_table(table: list[dict[str, Any]]) -> str:
    """The terminal table: one line per (N, strategy)."""
    sources = source_columns(table)
    head = (
        f"{'N':>4} {'strategy':<14} {'tok/s':>8} {'of best':>7} {'TTFT p50':>9} "
        f"{'p95':>8} {'p99':>8} {'follow-up':>9} " + " ".join(f"{s[:8]:>8}" for s in sources)
    )
    lines = [head, "-" * len(head)]
    for row in table:
        ttft, fractions = row["ttft_ms"], row["prompt_fraction_from"]
        share = row["fraction_of_ceiling"]
        lines.append(
            f"{row['conversations']:>4} {row['strategy']:<14} {row['throughput_tok_s']:>8.0f} "
            f"{share if share is None else format(share, '.0%'):>7} {ttft['p50']:>7.1f}ms "
            f"{ttft['p95']:>6.1f}ms {ttft['p99']:>6.1f}ms "
            f"{row['follow_up_ttft_ms']['p50']:>7.1f}ms "
            + " ".join(f"{fractions.get(s, 0.0):>8.0%}" for s in sources)
        )
    lines.append(
        "TTFT of all requests, then TTFT p50 of follow-up turns (a cached prefix); "
        "the last columns say where prompt tokens came from."
    )
    return "\n".join(lines)


def format_headline(top: dict[str, Any]) -> str:
    return (
        f"At {top['conversations']} conversations, {top['strategy']} serves "
        f"{top['throughput_over_recompute']}x the throughput of recompute, "
        f"{top['fraction_of_ceiling']:.0%} of the ceiling; follow-up TTFT p50 "
        f"{top['follow_up_ttft_p50_ms']:.1f} ms against "
        f"{top['recompute_follow_up_ttft_p50_ms']:.1f} ms recomputed."
    )


def to_json(sweep: Sweep, table: list[dict[str, Any]]) -> dict[str, Any]:
    options = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(sweep.options).items()}
    return {
        "options": options,
        "model": sweep.identity.describe(),
        "capacities": sweep.capacities,
        "strategies": sweep.strategies,
        "results": table,
        "headline": headline(sweep, table),
    }


#: The chart's panels: title, y label, and the value of a row.
PANELS: list[tuple[str, str, Any]] = [
    ("Throughput", "tokens / s", lambda row: row["throughput_tok_s"]),
    ("Throughput as a fraction of the ceiling", "of ceiling",
     lambda row: row["fraction_of_ceiling"] or 0.0),
    ("TTFT p50, follow-up turns (cached prefix)", "ms",
     lambda row: row["follow_up_ttft_ms"]["p50"]),
]  # fmt: skip


def write_chart(sweep: Sweep, table: list[dict[str, Any]], path: Path) -> None:
    """Throughput (absolute and as a fraction of the ceiling) and follow-up TTFT p50 against
    conversations, one line per strategy, over bands that mark the three regimes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(16, 4.8))
    sizes = sweep.options.conversations
    for axis, (title, unit, value) in zip(axes, PANELS, strict=True):
        for name in sweep.strategies:
            mine = [row for row in table if row["strategy"] == name]
            axis.plot(
                [row["conversations"] for row in mine],
                [value(row) for row in mine],
                "--" if name == CEILING else "-",
                marker="o",
                label=name,
            )
        _shade_regimes(axis, sweep.capacities, sizes)
        axis.set(title=title, xlabel="conversations", ylabel=unit, xscale="log")
        axis.set_xticks(sizes, [str(n) for n in sizes])
        axis.minorticks_off()
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    axes[0].legend(loc="lower left")
    options = sweep.options
    fig.suptitle(
        f"kvtier bench: {options.model} model, {options.rounds + 1} turns per "
        f"conversation, first prompt {options.first_prompt_tokens} tokens"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _shade_regimes(axis: Any, capacities: dict[str, Any], sweep: tuple[int, ...]) -> None:
    """Background bands: where the accelerator, host memory, or only a storage tier holds all.

    A tier holds N conversations while N <= its capacity, so each band ends half a
    conversation past it.
    """
    low, high = min(sweep) / 1.25, max(sweep) * 1.25
    device = capacities["device_conversations"] + 0.5
    host = capacities["host_conversations"] + 0.5
    regimes = [
        (low, device, "accelerator\nholds it"),
        (device, host, "host offload\nholds it"),
        (host, high, "storage tier\nholds it"),
    ]
    for (start, stop, label), color in zip(regimes, ("#e8f4e8", "#e8eef8", "#f8efe4"), strict=True):
        start, stop = max(start, low), min(stop, high)
        if start >= stop:
            continue
        axis.axvspan(start, stop, color=color, zorder=0)
        axis.text(
            (start * stop) ** 0.5,
            0.98,
            label,
            transform=axis.get_xaxis_transform(),
            ha="center",
            va="top",
            fontsize=7,
            color="#555",
        )
    axis.set_xlim(low, high)
