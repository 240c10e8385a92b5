"""The verdict of ``kvtier bench --engine vllm|sglang --repeat K``: is kvtier-fs ahead of the
engine's own fs tier (vllm-fs, sglang-file)?

From the same-run ratios of every round (``engine_report.same_run_ratios``: kvtier-fs over the
other at one round and N, both measured minutes apart under the same load), per N: the
median ratio over the rounds with its 95 % interval (``verdict.interval``; 6 rounds at least) for
throughput and TTFT p99, and, shown but not judged, for TTFT p50 (the typical request, where a
tier's load time shows before the queueing of a few slow requests does) and CPU time per request
when the runners measured it (how much work a request cost, where wall time also counts waiting
for a shared machine). The verdict reads throughput (higher is better) and TTFT p99 (lower is
better) as ``verdict`` defines: ``ahead``, ``behind``, ``no difference shown``, or ``mixed``.
"""

from __future__ import annotations

from typing import Any

from kvtier.bench import verdict

#: ratio key in a same-run ratio -> (report name, higher is better, judged).
METRICS = {
    "throughput_ratio": ("throughput", True, True),
    "ttft_p99_ratio": ("ttft_p99", False, True),
    "ttft_p50_ratio": ("ttft_p50", False, False),
    "cpu_ratio": ("cpu_per_request", False, False),
}


def verdicts(ratios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per N (ascending): each metric's interval and verdict, and the overall verdict."""
    out = []
    for n in sorted({r["conversations"] for r in ratios}):
        at = [r for r in ratios if r["conversations"] == n]
        item: dict[str, Any] = {"conversations": n, "rounds": len(at)}
        judged = []
        for key, (name, higher, judge) in METRICS.items():
            values = [r[key] for r in at if r.get(key) is not None]
            if not values:
                continue
            found = verdict.interval(values)
            item[name] = found.to_json()
            if judge:
                item[name]["verdict"] = verdict.metric_verdict(found, higher)
                judged.append(item[name]["verdict"])
        item["verdict"] = verdict.overall(judged)
        out.append(item)
    return out


def _describe(found: dict[str, Any]) -> str:
    return verdict.Interval(
        found["median"], found["low"], found["high"], found["rounds"]
    ).describe()


def verdict_lines(items: list[dict[str, Any]], pair: str) -> list[str]:
    """The terminal table of ``verdicts``: one line per N; ``pair``: ``mine / other``."""
    lines = [f"{pair} over rounds: median ratio [{verdict.LEVEL:.0%} interval of the median]"]
    for item in items:
        parts = [
            f"{label} {_describe(item[name])}"
            for name, label in (
                ("throughput", "throughput"),
                ("ttft_p99", "TTFT p99"),
                ("ttft_p50", "TTFT p50"),
                ("cpu_per_request", "CPU/request"),
            )
            if name in item
        ]
        lines.append(f"N={item['conversations']}: " + ", ".join(parts) + f": {item['verdict']}")
    return lines


def plot_intervals(axis: Any, items: list[dict[str, Any]], pair: str) -> None:
    """One panel: the median ratios with their intervals as error bars, 1.0 marked."""
    for offset, (name, label) in enumerate(
        (("throughput", "throughput"), ("ttft_p99", "TTFT p99"))
    ):
        found = [item for item in items if name in item]
        if not found:
            continue
        xs = [item["conversations"] * (1 + 0.04 * offset) for item in found]
        medians = [item[name]["median"] for item in found]
        low = [m - (item[name]["low"] or m) for m, item in zip(medians, found, strict=True)]
        high = [(item[name]["high"] or m) - m for m, item in zip(medians, found, strict=True)]
        axis.errorbar(xs, medians, yerr=[low, high], fmt="o", capsize=4, label=label)
    axis.axhline(1.0, color="grey", linestyle=":")
    rounds = max((item["rounds"] for item in items), default=0)
    axis.set(
        title=f"{pair}, {rounds} rounds ({verdict.LEVEL:.0%} interval)",
        xlabel="conversations",
        ylabel="ratio",
        xscale="log",
    )
    axis.legend(loc="best")
    axis.grid(alpha=0.3)
