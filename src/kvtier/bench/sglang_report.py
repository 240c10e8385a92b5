"""Reports of ``kvtier bench --engine sglang``: the engine benches' table, JSON and chart.

The rows, table and chart are ``engine_report``'s; prompt tokens by source come from SGLang's
``cached_tokens_details`` of every request (``device``: L1, ``host``: L2, ``storage``: L3; the
rest ``computed``). SGLang counts no bytes per tier, so ``bytes`` stays empty; the L3
directories' sizes are ``disk_bytes_after_run``.

Same-run ratios per round and N: ``kvtier_fs_vs_sglang_file`` (kvtier's backend against
SGLang's ``file`` backend), with ``--repeat`` a verdict per N; ``l3_replay``: per L3 strategy,
the prompt tokens SGLang asked L3 for on the identical replay after a flush and the fraction
L3 served (``hit_ratio``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtier.bench import engine_report, pair_verdict
from kvtier.bench.engine_report import format_table, same_run_ratios
from kvtier.bench.sglang_strategies import KVTIER_FS, SGLANG_FILE

__all__ = ["format_table"]

PAIR = "kvtier-fs / sglang-file"
RATIOS = "kvtier_fs_vs_sglang_file"
VERDICT = "kvtier_fs_vs_sglang_file_verdict"  # the document's key of the pair's verdicts
SOURCES = ("device", "host", "storage")


def counted(phase: dict[str, Any], prompt_tokens: int) -> tuple[dict[str, int], dict[str, int]]:
    """``engine_report.Counted`` from the requests' ``cached`` sources."""
    out = {s: sum(r.get("cached", {}).get(s, 0) for r in phase["requests"]) for s in SOURCES}
    out["computed"] = prompt_tokens - sum(out.values())
    return out, {}


def rows(reports: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """``engine_report.rows`` of the servers' reports, read with SGLang's cached sources."""
    return engine_report.rows(reports, counted)


def to_json(
    options: Any, pools: Any, reports: dict[str, Any], table: list[dict[str, Any]]
) -> dict[str, Any]:
    ratios = same_run_ratios(table, KVTIER_FS, SGLANG_FILE)
    return {
        "engine": "sglang",
        **engine_report.header(options, reports),
        "pools_tokens": vars(pools),
        "results": table,
        RATIOS: ratios,
        VERDICT: pair_verdict.verdicts(ratios),
        "l3_replay": {s: r["l3_replay"] for s, r in reports.items() if "l3_replay" in r},
    }


def ratio_lines(document: dict[str, Any]) -> list[str]:
    """The terminal lines of the same-run ratios, the verdict and the L3 replay."""
    lines = engine_report.pair_lines(document[RATIOS], PAIR)
    if document.get(VERDICT):
        lines += pair_verdict.verdict_lines(document[VERDICT], PAIR)
    for strategy, replay in document["l3_replay"].items():
        ratio = replay["hit_ratio"]
        lines.append(
            f"{strategy} L3 replay after a flush: {replay['served_tokens']} of the "
            f"{replay['asked_tokens']} prompt tokens SGLang asked L3 for were served "
            f"({'-' if ratio is None else format(ratio, '.1%')}), {replay['prompts']} prompts"
        )
    return lines


def write_chart(
    table: list[dict[str, Any]], title: str, path: Path, items: list[dict[str, Any]] | None = None
) -> None:
    """``engine_report.write_chart``; ``items``: the kvtier-fs / sglang-file verdicts."""
    engine_report.write_chart(table, title, path, items, PAIR)
