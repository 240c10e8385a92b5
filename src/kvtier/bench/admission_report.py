"""Reports of ``kvtier bench --admission``: a terminal table, a JSON file and a PNG chart.

Per (N, policy): throughput (and over ``admit all`` at the same N), TTFT, hit quality (the share
of prompt tokens served from the accelerator pool, host memory or a tier instead of recomputed,
for all prompts and for follow-up turns alone: one-shot prompts can never be served), bytes
written into each level (host memory: the engine's copies into host slots; a tier: its stores),
and the chunks admission dropped, per level and reason. Everything is read from what the runs
counted (``RunResult.sources`` and the manager's counters); nothing is estimated.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtier.bench.admission import ADMIT_ALL, AdmissionSweep
from kvtier.bench.engine import RunResult
from kvtier.bench.report import agreement, measured, ratio
from kvtier.integrations.transformers import RECOMPUTED, SKIPPED

HOST_WRITES = "kvtier_transfer_bytes_total{direction=accelerator_to_host}"
_COUNTER = re.compile(r"^(\w+)\{(.*)\}$")


def counters(result: RunResult, name: str) -> list[tuple[dict[str, str], float]]:
    """The labelled values of counter ``name`` in the run's manager stats."""
    found = []
    for key, value in result.stats.get("counters", {}).items():
        match = _COUNTER.match(key)
        if match and match.group(1) == name:
            labels = dict(part.split("=", 1) for part in match.group(2).split(",") if part)
            found.append((labels, value))
    return found


def bytes_written(result: RunResult) -> dict[str, int]:
    """Bytes written into host memory (``host``) and into each secondary tier, by name."""
    written = {"host": int(result.stats.get("counters", {}).get(HOST_WRITES, 0))}
    for labels, value in counters(result, "kvtier_tier_bytes_total"):
        if labels.get("op") == "store":
            written[labels["tier"]] = written.get(labels["tier"], 0) + int(value)
    return written


def dropped(result: RunResult) -> dict[str, dict[str, int]]:
    """Chunks admission dropped: level -> reason -> count."""
    found: dict[str, dict[str, int]] = {}
    for labels, value in counters(result, "kvtier_admission_dropped_total"):
        found.setdefault(labels["tier"], {})[labels["reason"]] = int(value)
    return found


def served_fraction(sources: dict[str, int]) -> float:
    """The share of prompt tokens not recomputed (skipped ones count as served)."""
    total = sum(v for k, v in sources.items() if k != SKIPPED)
    return round(1 - sources.get(RECOMPUTED, 0) / total, 4) if total else 0.0


def summarize(result: RunResult, reference: RunResult | None) -> dict[str, Any]:
    """One row; ``reference`` is ``admit all`` at the same N."""
    drops = dropped(result)
    return {
        "conversations": result.num_conversations,
        "policy": result.strategy,
        **measured(result),
        "throughput_over_admit_all": ratio(result.throughput, reference),
        "served_fraction": served_fraction(result.sources),
        "follow_up_served_fraction": served_fraction(result.follow_up_sources),
        "bytes_written": bytes_written(result),
        "chunks_dropped": drops,
        "chunks_dropped_total": sum(n for reasons in drops.values() for n in reasons.values()),
        "answers_equal_to_admit_all": agreement(result, reference),
    }


def rows(sweep: AdmissionSweep) -> list[dict[str, Any]]:
    """One row per (N, policy), in the sweep's order; each with its policy's admission."""
    references = {r.num_conversations: r for r in sweep.results if r.strategy == ADMIT_ALL}
    described = {policy.name: policy.describe() for policy in sweep.policies}
    table = []
    for result in sweep.results:
        row = summarize(result, references.get(result.num_conversations))
        table.append({**row, "admission": described[result.strategy]})
    return table


def headline(table: list[dict[str, Any]]) -> dict[str, Any]:
    """At the largest N: the fastest policy against ``admit all``."""
    largest = max(row["conversations"] for row in table)
    at = [row for row in table if row["conversations"] == largest]
    reference = next(row for row in at if row["policy"] == ADMIT_ALL)
    best = max(at, key=lambda row: row["throughput_tok_s"])
    return {
        "conversations": largest,
        "policy": best["policy"],
        "throughput_over_admit_all": best["throughput_over_admit_all"],
        "follow_up_served_fraction": best["follow_up_served_fraction"],
        "admit_all_follow_up_served_fraction": reference["follow_up_served_fraction"],
        "bytes_written": sum(best["bytes_written"].values()),
        "admit_all_bytes_written": sum(reference["bytes_written"].values()),
    }


def format_headline(top: dict[str, Any]) -> str:
    if top["policy"] == ADMIT_ALL:
        return (
            f"At {top['conversations']} conversations no admission policy beat admitting "
            f"everything; see the table."
        )
    written, all_written = top["bytes_written"], top["admit_all_bytes_written"]
    return (
        f"At {top['conversations']} conversations, {top['policy']} serves "
        f"{top['throughput_over_admit_all']}x the throughput of admit all; follow-up turns got "
        f"{top['follow_up_served_fraction']:.0%} of their prompt tokens from cache against "
        f"{top['admit_all_follow_up_served_fraction']:.0%}, writing {written / 2**20:.0f} MiB "
        f"instead of {all_written / 2**20:.0f} MiB."
    )


def format_table(table: list[dict[str, Any]]) -> str:
    """The terminal table: one line per (N, policy)."""
    levels = sorted(
        {level for row in table for level in row["bytes_written"]},
        key=lambda level: (level != "host", level),
    )
    head = (
        f"{'N':>4} {'policy':<18} {'tok/s':>7} {'vs all':>6} {'fu TTFT':>8} "
        f"{'served':>6} {'fu srv':>6} "
        + " ".join(f"{'MiB ' + level[:6]:>10}" for level in levels)
        + f" {'dropped':>8}"
    )
    lines = [head, "-" * len(head)]
    for row in table:
        ratio = row["throughput_over_admit_all"]
        written = row["bytes_written"]
        lines.append(
            f"{row['conversations']:>4} {row['policy']:<18} {row['throughput_tok_s']:>7.0f} "
            f"{'-' if ratio is None else format(ratio, '.2f'):>6} "
            f"{row['follow_up_ttft_ms']['p50']:>6.1f}ms {row['served_fraction']:>6.0%} "
            f"{row['follow_up_served_fraction']:>6.0%} "
            + " ".join(f"{written.get(level, 0) / 2**20:>10.1f}" for level in levels)
            + f" {row['chunks_dropped_total']:>8}"
        )
    lines.append(
        "vs all: throughput over admit all; fu TTFT: TTFT p50 of follow-up turns; served / fu "
        "srv: prompt tokens served from cache, all prompts / follow-up turns; MiB written into "
        "each level; chunks dropped by admission."
    )
    return "\n".join(lines)


def to_json(sweep: AdmissionSweep, table: list[dict[str, Any]]) -> dict[str, Any]:
    bench = {
        k: list(v) if isinstance(v, tuple) else v for k, v in vars(sweep.options.bench).items()
    }
    options = {
        **bench,
        "one_shots_per_round": sweep.options.one_shots_per_round,
        "one_shot_tokens": sweep.options.one_shot_tokens,
    }
    return {
        "mode": "admission",
        "options": options,
        "model": sweep.identity.describe(),
        "capacities": sweep.capacities,
        "policies": [{"name": p.name, "admission": p.describe()} for p in sweep.policies],
        "results": table,
        "headline": headline(table),
    }


#: The chart's panels: title, y label, and the values of a row (stacked when several).
PANELS: list[tuple[str, str, Callable[[dict[str, Any]], dict[str, float]]]] = [
    ("Throughput", "tokens / s", lambda row: {"": row["throughput_tok_s"]}),
    ("Follow-up prompt tokens served from cache", "fraction",
     lambda row: {"": row["follow_up_served_fraction"]}),
    ("Bytes written per level", "MiB",
     lambda row: {k: v / 2**20 for k, v in row["bytes_written"].items()}),
    ("Chunks dropped by admission", "chunks", lambda row: {"": row["chunks_dropped_total"]}),
]  # fmt: skip


def write_chart(sweep: AdmissionSweep, table: list[dict[str, Any]], path: Path) -> None:
    """One bar chart per panel: a group of bars per N, one bar per policy (stacked by level
    for the bytes written)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(18, 4.8))
    names = [policy.name for policy in sweep.policies]
    sizes = sweep.options.bench.conversations
    width = 0.8 / len(names)
    for axis, (title, unit, values) in zip(axes, PANELS, strict=True):
        for i, name in enumerate(names):
            mine = {row["conversations"]: values(row) for row in table if row["policy"] == name}
            _stacked_bars(
                axis,
                [x + (i - (len(names) - 1) / 2) * width for x in range(len(sizes))],
                [mine.get(n, {}) for n in sizes],
                width,
                f"C{i}",
                name,
            )
        axis.set(title=title, xlabel="conversations", ylabel=unit)
        axis.set_xticks(range(len(sizes)), [str(n) for n in sizes])
        axis.grid(alpha=0.3, axis="y")
    axes[0].legend(loc="lower left", fontsize=8)
    options = sweep.options
    fig.suptitle(
        f"kvtier bench --admission: {options.bench.model} model, "
        f"{options.one_shots_per_round} one-shot prompts per round among the "
        f"conversations"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _stacked_bars(
    axis: Any, xs: list[float], stacks: list[dict[str, float]], width: float, color: str, label: str
) -> None:
    """Bars at ``xs``, each a stack of its values (host memory first, hatched tiers above)."""
    bottoms = [0.0] * len(xs)
    levels = sorted(
        {k for stack in stacks for k in stack}, key=lambda k: (k not in ("", "host"), k)
    )
    for j, level in enumerate(levels):
        heights = [stack.get(level, 0.0) for stack in stacks]
        axis.bar(
            xs,
            heights,
            width,
            bottom=bottoms,
            color=color,
            edgecolor="white",
            hatch="//" if j else None,
            label=label if j == 0 else None,
        )
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
