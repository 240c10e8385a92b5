"""Reports of ``kvtier bench --engine vllm``: table, JSON and a four-panel chart.

The rows, table and chart are ``engine_report``'s; this module reads vLLM's counters for them:
prompt tokens by source (vLLM's ``prompt_tokens_cached_by_source``; the rest ``computed``) and
bytes moved per tier (host memory ``host_read``/``host_written``, each secondary tier
``<tier>_read``/``<tier>_written``).

Same-run ratios per N: ``kvtier_fs_vs_vllm_fs`` (kvtier's fs tier against vLLM's) and, when
``kvtier-fs-ops`` ran beside ``kvtier-fs``, ``kvtier_fs_ops_vs_kvtier_fs`` (the operator
plane on against off), with what the ops engine's kvtier ``/metrics`` served at its end
(``operator_plane``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtier.bench import engine_report, pair_verdict
from kvtier.bench.engine_report import format_table, same_run_ratios
from kvtier.bench.vllm_strategies import KVTIER_FS, KVTIER_FS_OPS, VLLM_FS

__all__ = ["format_table"]

#: vLLM counter -> the byte column it feeds (tiered ones carry ``tier=<i>:<type>``).
BYTE_COUNTERS = {
    "vllm:kv_offload_load_bytes": "host_read", "vllm:kv_offload_store_bytes": "host_written",
    "vllm:kv_offload_tiering_read_bytes": "read", "vllm:kv_offload_tiering_write_bytes": "written",
}  # fmt: skip
PAIR = "kvtier-fs / vllm-fs"
VERDICT = "kvtier_fs_vs_vllm_fs_verdict"  # the document's key of the pair's verdicts


def _parse(key: str) -> tuple[str, dict[str, str]]:
    name, _, rest = key.partition("{")
    return name, dict(p.split("=", 1) for p in rest.rstrip("}").split(",") if "=" in p)


def sources(grown: dict[str, float], prompt_tokens: int) -> dict[str, int]:
    """Prompt tokens by source: vLLM's cached sources, and ``computed`` for the rest."""
    out: dict[str, int] = {}
    for key, value in grown.items():
        name, labels = _parse(key)
        if name == "vllm:prompt_tokens_cached_by_source":
            out[labels["source"]] = out.get(labels["source"], 0) + int(value)
    out["computed"] = prompt_tokens - sum(out.values())
    return out


def bytes_moved(grown: dict[str, float]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in grown.items():
        name, labels = _parse(key)
        column = BYTE_COUNTERS.get(name)
        if column is not None:
            tier = labels.get("tier", "").split(":")[-1]
            label = f"{tier}_{column}" if tier else column
            out[label] = out.get(label, 0) + int(value)
    return out


def counted(phase: dict[str, Any], prompt_tokens: int) -> tuple[dict[str, int], dict[str, int]]:
    """``engine_report.Counted`` from the vLLM counters a phase grew (``grown``)."""
    return sources(phase["grown"], prompt_tokens), bytes_moved(phase["grown"])


def rows(reports: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """``engine_report.rows`` of the runners' reports, read with vLLM's counters."""
    return engine_report.rows(reports, counted)


def kvtier_vs_vllm(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per round and N: kvtier-fs over vllm-fs in throughput and TTFT p99 (aims: >= 1, <= 1)."""
    return same_run_ratios(table, KVTIER_FS, VLLM_FS)


def ops_vs_off(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per round and N: kvtier-fs-ops over kvtier-fs (the operator plane's cost; aim: 1)."""
    return same_run_ratios(table, KVTIER_FS_OPS, KVTIER_FS)


def ratio_lines(document: dict[str, Any]) -> list[str]:
    """The terminal lines of the same-run ratios and of the operator plane's scrape."""
    lines = engine_report.pair_lines(document["kvtier_fs_vs_vllm_fs"], PAIR)
    lines += engine_report.pair_lines(
        document["kvtier_fs_ops_vs_kvtier_fs"], "kvtier-fs-ops / kvtier-fs"
    )
    items = document.get("kvtier_fs_vs_vllm_fs_verdict")
    if items:
        lines += pair_verdict.verdict_lines(items, PAIR)
    plane = document.get("operator_plane")
    if plane is not None:
        sums = plane.get("sums", {})
        lines.append(
            f"kvtier-fs-ops operator plane: served {plane['served']}, "
            f"kvtier_tier_chunks_total {sums.get('kvtier_tier_chunks_total', 0):.0f}, "
            f"tiers disabled {sums.get('kvtier_tier_disabled_total', 0):.0f}, "
            f"admin {plane.get('admin_tiers', plane.get('error'))}"
        )
    return lines


def to_json(
    options: Any, pools: Any, model: Any, reports: dict[str, Any], table: list[dict[str, Any]]
) -> dict[str, Any]:
    ratios = kvtier_vs_vllm(table)
    return {
        "engine": "vllm",
        **engine_report.header(options, reports),
        "model": {"path": str(model.path), "dummy": model.dummy},
        "pools_blocks": vars(pools),
        "block_bytes": model.block_bytes,
        "results": table,
        "kvtier_fs_vs_vllm_fs": ratios,
        "kvtier_fs_vs_vllm_fs_verdict": pair_verdict.verdicts(ratios),
        "kvtier_fs_ops_vs_kvtier_fs": ops_vs_off(table),
        "operator_plane": reports.get(KVTIER_FS_OPS, {}).get("operator_plane"),
    }


def write_chart(
    table: list[dict[str, Any]], title: str, path: Path, items: list[dict[str, Any]] | None = None
) -> None:
    """``engine_report.write_chart``; ``items``: the kvtier-fs / vllm-fs verdicts."""
    engine_report.write_chart(table, title, path, items, PAIR)
