"""Outputs of ``kvtier plan``: the short text report, the JSON for scripts, the kvtier config
of the recommendation (vLLM's ``--kv-transfer-config`` is ``vllm_line``'s), and the PNG chart
(miss-ratio curves and reuse-distance histograms; needs matplotlib, the ``bench`` extra).

Runs on the caller's thread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.plan.analysis import Analysis
from kvtier.plan.reuse import AGE_EDGES, PREFIX_LABELS
from kvtier.plan.verdict import VERDICT_TEXT, Recommendation, size


def text(a: Analysis, rec: Recommendation, name: str) -> str:
    """The short report: verdict and reasons first, then the figures behind them."""
    trace, chunk = a.trace, a.chunk
    span = float(trace.times.max() - trace.times.min()) if trace.num_requests else 0.0
    lines = [
        f"kvtier plan: {name}: {trace.num_requests:,} requests, "
        f"{int(a.total_tokens):,} prompt tokens over {span:,.0f} s{_skipped(a)}",
        f"verdict: {VERDICT_TEXT[rec.verdict]}",
    ]
    lines += [f"  - {reason}" for reason in rec.reasons]
    lines += [f"warning: {warning}" for warning in rec.warnings]
    sizes = ", ".join(f"{o.chunk_tokens}: {o.reuse_share:.1%}" for o in a.by_chunk_size)
    lines += [
        f"reuse:         {chunk.reuse_share:.1%} of prompt tokens repeat an earlier prefix; "
        f"{chunk.unique_share:.1%} of prompts reuse nothing",
        f"chunk size:    {chunk.chunk_tokens} tokens ({size(a.chunk_bytes)} per chunk); reuse "
        f"by chunk size: {sizes}",
        f"settings:      {_settings(rec)}",
        f"predicted:     {_shares(rec)} of prompt tokens",
        *[f"saves:         {_cost(c)}" for c in rec.costs],
        f"headroom:      {_headroom(rec)}",
        f"rates:         prefill {rec.rates.prefill_tokens_per_s:,.0f} tokens/s, fs read "
        f"{rec.rates.fs_read_bps / 1e9:.2f} GB/s, host to device "
        f"{rec.rates.host_to_device_bps / 1e9:.0f} GB/s ({rec.rates.source})",
        f"curves:        {_methods(a)}",
    ]
    return "\n".join(lines)


def _skipped(a: Analysis) -> str:
    """The skipped lines: their count, the 3 commonest reasons, and always the lines too long
    to read within the memory budget."""
    skipped = a.trace.skipped
    if not skipped:
        return ""
    shown = [reason for reason, _ in skipped.most_common(3)]
    shown += [r for r in skipped if r.startswith("lines over ") and r not in shown]
    reasons = "; ".join(f"{skipped[reason]:,} {reason}" for reason in shown)
    return f" ({sum(skipped.values()):,} lines skipped: {reasons})"


def _settings(rec: Recommendation) -> str:
    parts = [
        f"cpu_bytes_to_use {size(rec.cpu_bytes_to_use)} (knee {size(rec.knees['host_bytes'])})",
        f"eviction_policy {rec.eviction_policy}",
        f"admission {rec.admission or 'none'}",
    ]
    if rec.fs_max_bytes is not None:
        parts.append(f"fs max_bytes {size(rec.fs_max_bytes)}")
    return ", ".join(parts)


def _shares(rec: Recommendation) -> str:
    return "  ".join(f"{tier} {share:.1%}" for tier, share in rec.predicted.items())


def _cost(c: Any) -> str:
    return (
        f"{c.tier}: {c.tokens_saved:,.0f} prompt tokens, {c.prefill_saved_s:,.0f} s of prefill, "
        f"for {size(c.bytes_read)} read ({c.transfer_s:,.0f} s) and {size(c.bytes_written)} "
        f"written; net {c.net_saved_s:,.0f} s"
    )


def _headroom(rec: Recommendation) -> str:
    room = rec.headroom
    return (
        f"{size(room.total)} host memory - {size(room.process)} process - {size(room.os)} OS "
        f"- {size(room.page_cache)} page cache = {size(room.available)} for cpu_bytes_to_use"
    )


def _methods(a: Analysis) -> str:
    lru = a.curves["lru"]
    text = f"LRU: {lru.method}"
    if lru.error:
        text += f" (standard error {lru.error:.2%})"
    arc = a.curves["arc"]
    text += f"; ARC: {arc.method}"
    return text + (f" (error up to {arc.error:.2%})" if arc.error else "")


def kvtier_config(
    rec: Recommendation, a: Analysis, fs_root: str, base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The recommendation as a kvtier configuration (``base``: a config to update, whole or
    its ``kv_connector_extra_config``)."""
    outer = dict(base or {})
    inner = dict(outer.get("kv_connector_extra_config", outer))
    inner.pop("blocks_per_chunk", None)
    inner.update(
        cpu_bytes_to_use=rec.cpu_bytes_to_use,
        block_size=a.chunk.chunk_tokens,
        eviction_policy=rec.eviction_policy,
    )
    tiers = [dict(t) for t in inner.get("secondary_tiers", []) if t.get("type") != "fs"]
    if rec.fs_max_bytes is not None:
        old = [t for t in inner.get("secondary_tiers", []) if t.get("type") == "fs"]
        fs = {
            **(old[0] if old else {"type": "fs", "root_dir": fs_root}),
            "max_bytes": rec.fs_max_bytes,
        }
        tiers.insert(0, fs)
    inner["secondary_tiers"] = tiers
    _host_admission(rec, inner)
    if "kv_connector_extra_config" in outer:
        return {**outer, "kv_connector_extra_config": inner}
    return inner


def _host_admission(rec: Recommendation, inner: dict[str, Any]) -> None:
    """Second-use admission for host memory, when recommended (what the plan simulated);
    a base config's own host admission is kept."""
    levels = [e for e in inner.get("admission", []) if e.get("level", "host") == "host"]
    if rec.admission is not None and not levels and "store_threshold" not in inner:
        inner["admission"] = [*inner.get("admission", []), {"level": "host", "min_reuse": 2}]


def to_json(a: Analysis, rec: Recommendation, name: str) -> dict[str, Any]:
    """Everything of the report, for scripts."""
    hist = a.histograms
    return {
        "trace": {
            "path": name,
            "requests": a.trace.num_requests,
            "prompt_tokens": int(a.total_tokens),
            "skipped_lines": dict(a.trace.skipped),
            "chunk_tokens": a.trace.chunk_tokens,
        },
        "verdict": rec.verdict,
        "reasons": rec.reasons,
        "warnings": rec.warnings,
        "reuse": {
            "share": a.chunk.reuse_share,
            "unique_prompt_share": a.chunk.unique_share,
            "by_chunk_size": [vars(o) for o in a.by_chunk_size],
        },
        "chunk_tokens": a.chunk.chunk_tokens,
        "chunk_bytes": a.chunk_bytes,
        "recommended": {
            "cpu_bytes_to_use": rec.cpu_bytes_to_use,
            "eviction_policy": rec.eviction_policy,
            "admission": rec.admission,
            "fs_max_bytes": rec.fs_max_bytes,
            "knees": rec.knees,
        },
        "predicted_share": rec.predicted,
        "costs": [{**vars(c), "net_saved_s": c.net_saved_s} for c in rec.costs],
        "headroom": {**vars(rec.headroom), "available": rec.headroom.available},
        "rates": vars(rec.rates),
        "curves": [c.to_json(a.chunk_bytes) for c in _all_curves(a, rec)],
        "histograms": None
        if hist is None
        else {
            "prefix_buckets": list(PREFIX_LABELS),
            "bytes_edges": hist.bytes_edges,
            "bytes_tokens": hist.bytes_tokens,
            "age_edges_s": list(AGE_EDGES),
            "age_tokens": hist.age_tokens,
        },
    }


def _all_curves(a: Analysis, rec: Recommendation) -> list[Any]:
    return [*a.curves.values(), *([rec.fs_curve] if rec.fs_curve is not None else [])]


def json_text(document: dict[str, Any]) -> str:
    """The plan's JSON document as written to ``plan.json``."""
    return json.dumps(document, indent=1, default=float) + "\n"


def write_json(document: dict[str, Any], path: Path) -> None:
    path.write_text(json_text(document))


def write_chart(a: Analysis, rec: Recommendation, path: Path, title: str) -> None:
    """Hit ratio against capacity (every curve, with the device pool, the recommendation and
    the headroom marked), and the reuse-distance histograms in bytes and in age."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    _curves_panel(axes[0], a, rec)
    if a.histograms is not None:
        edges = a.histograms.bytes_edges
        labels = [size(e) for e in edges[1:]]
        _stacked(
            axes[1],
            labels,
            a.histograms.bytes_tokens,
            "reuse distance (LRU bytes), up to",
            "Reuse distance in bytes",
        )
        ages = [f"{e:g}s" for e in AGE_EDGES] + ["more"]
        _stacked(
            axes[2],
            ages,
            a.histograms.age_tokens,
            "time since the chunk was created, up to",
            "Reuse distance in time since creation",
        )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _curves_panel(axis: Any, a: Analysis, rec: Recommendation) -> None:
    cb = a.chunk_bytes
    for key, style in (("lru", "-"), ("lru_admit", "--"), ("arc", "o-"), ("arc_admit", "s--")):
        c = a.curves[key]
        axis.plot(np.maximum(c.capacities, 0.5) * cb, c.hit, style, label=c.name, markersize=4)
    if rec.fs_curve is not None:
        c = rec.fs_curve
        axis.plot(
            rec.cpu_bytes_to_use + c.capacities * cb, c.hit, ":", label="host (recommended) + fs"
        )
    marks = [
        (a.options.device_bytes, "device pool", "#888"),
        (rec.cpu_bytes_to_use, "host (recommended)", "#2a7"),
        (rec.headroom.available, "host headroom", "#c33"),
    ]
    for x, label, color in marks:
        axis.axvline(max(x, cb), color=color, lw=1, ls="-.", label=label)
    axis.axhline(a.chunk.reuse_share, color="#aaa", lw=0.8, label="any cache (reuse share)")
    axis.set(
        xscale="log",
        xlabel="capacity (bytes)",
        ylabel="share of prompt tokens served",
        title="Hit ratio against capacity",
        ylim=(0, 1),
    )
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="upper left")


def _stacked(
    axis: Any, labels: list[str], rows: list[list[float]], xlabel: str, title: str
) -> None:
    bottom = np.zeros(len(labels))
    x = np.arange(len(labels))
    for name, row in zip(PREFIX_LABELS, rows, strict=True):
        axis.bar(x, row, bottom=bottom, label=f"prefix {name}")
        bottom += np.array(row)
    axis.set_xticks(x, labels, rotation=60, fontsize=7)
    axis.set(xlabel=xlabel, ylabel="reused prompt tokens", title=title)
    axis.legend(fontsize=7)
