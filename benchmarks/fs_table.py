"""The README's table of the fs tier against vLLM's, rendered from ``fs_vs_vllm.py``'s JSON.

    python benchmarks/fs_table.py docs/performance/<run>.json

prints the Markdown table (and the line naming commit, command and load) that the README
carries between its ``fs-vs-vllm`` markers; ``tests/docs`` checks that the README's table is
this rendering of the JSON it names, so the table can only change by rerunning the benchmark.
Every ratio is read from the JSON (kvtier's GB/s over the other side's, same run); nothing is
computed here but formatting. A run with ``intervals`` (since 2026-12-06) shows the median of
the per-round ratios with its 95 % interval, ``0.990x [0.950, 1.040]``, and the cold loads'
verdict; an older run, the ratio of the medians alone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

TIMES = "\u00d7"  # the multiplication sign the docs write ratios with
HEADER = (
    "| chunk | store | load, hot | load, cold | {verdict}cold, kvtier / raw | {extra}"
    "CPU µs per cold chunk, kvtier / vLLM |"
)
VERDICT = "cold, verdict | "


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _extras(result: dict[str, Any]) -> list[str]:
    """kvtier columns with other config fields (``--extra-kvtier``), in the JSON's order."""
    return [name for name in result["GBps"] if name.startswith("kvtier[")]


def _label(name: str) -> str:
    """``kvtier[field=value,...]`` as its fields; a value that is a path (a key file) left out."""
    fields = name[len("kvtier[") : -1].split(",")
    return ",".join(f.split("=", 1)[0] if "/" in f else f for f in fields)


def _ratio(
    result: dict[str, Any], pair: str, phase: str, sign: str = TIMES, bold: bool = False
) -> str:
    """``pair``'s ratio at ``phase``: ``0.990x [0.950, 1.040]`` from the run's intervals (the
    median of the per-round ratios), else the ratio of the medians; ``bold``: the figure in
    bold, not its interval."""
    found = result.get("intervals", {}).get(pair, {}).get(phase)
    mark = "**" if bold else ""
    if found is None:
        return f"{mark}{result['ratios'][pair][phase]:.2f}{sign}{mark}"
    figure = f"{mark}{found['median']:.3f}{sign}{mark}"
    if found["low"] is None:
        rounds = f"{found['rounds']} round{'s' if found['rounds'] != 1 else ''}"
        return f"{figure} ({rounds}: no interval)"
    # three places, as ``verdict.Interval.describe``: an interval that misses 1.0 never
    # prints as touching it
    return f"{figure} [{found['low']:.3f}, {found['high']:.3f}]"


def _row(result: dict[str, Any], extras: list[str]) -> str:
    cpu = result["cpu_us_per_chunk"]
    cells = [
        _size(result["chunk_bytes"]),
        _ratio(result, "kvtier/vllm", "store"),
        _ratio(result, "kvtier/vllm", "load_hot"),
        _ratio(result, "kvtier/vllm", "load_cold", bold=True),
        *([result["intervals"]["kvtier/vllm"]["load_cold"]["verdict"]] if _judged(result) else []),
        _ratio(result, "kvtier/raw", "load_cold", ""),
        *(_ratio(result, f"{name}/vllm", "load_cold") for name in extras),
        f"{cpu['kvtier']['load_cold']:,} / {cpu['vllm']['load_cold']:,}",
    ]
    return "| " + " | ".join(cells) + " |"


def _judged(result: dict[str, Any]) -> bool:
    return "intervals" in result


def render(document: dict[str, Any]) -> str:
    """The table (kvtier over vLLM's fs tier unless a column says otherwise) and its source."""
    results = document["results"]
    extras = _extras(results[0])
    extra = "".join(f"cold, `{_label(name)}` / vLLM | " for name in extras)
    judged = _judged(results[0])
    lines = [
        HEADER.format(verdict=VERDICT if judged else "", extra=extra),
        "|" + "---|" * (6 + judged + len(extras)),
        *(_row(result, extras) for result in results),
        "",
        f"Commit `{document.get('commit', 'unknown')}`, `{document.get('command', '?')}`; "
        f"{document['statistic']}, {document['threads']} threads, cold loads after "
        f"`{document['cold_cache']}`; load average {document['load_average_at_start'][0]} at "
        f"the start, {document['load_average_at_end'][0]} at the end.{_how(judged)}",
    ]
    return "\n".join(lines)


def _how(judged: bool) -> str:
    if not judged:
        return ""
    return (
        " Ratios: the median of the rounds' ratios [its 95 % interval]; the verdict is"
        " `ahead` when the interval lies above 1.0, `behind` when below."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, help="fs_vs_vllm.py's output")
    args = parser.parse_args()
    print(render(json.loads(args.json.read_text())))


if __name__ == "__main__":
    main()
