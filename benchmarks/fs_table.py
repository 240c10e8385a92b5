"""The README's table of the fs tier against vLLM's, rendered from ``fs_vs_vllm.py``'s JSON.

    python benchmarks/fs_table.py docs/performance/<run>.json

prints the Markdown table (and the line naming commit, command and load) that the README
carries between its ``fs-vs-vllm`` markers; ``tests/docs`` checks that the README's table is
this rendering of the JSON it names, so the table can only change by rerunning the benchmark.
Every ratio is read from the JSON (kvtier's GB/s over the other side's, same run); nothing is
computed here but formatting.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

TIMES = "\u00d7"  # the multiplication sign the docs write ratios with
HEADER = (
    "| chunk | store | load, hot | load, cold | cold, kvtier / raw | {extra}"
    "CPU µs per cold chunk, kvtier / vLLM |"
)


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _extras(result: dict[str, Any]) -> list[str]:
    """kvtier columns with other config fields (``--extra-kvtier``), in the JSON's order."""
    return [name for name in result["GBps"] if name.startswith("kvtier[")]


def _label(name: str) -> str:
    """``kvtier[field=value,...]`` as its fields; a value that is a path (a key file) left out."""
    fields = name[len("kvtier[") : -1].split(",")
    return ",".join(f.split("=", 1)[0] if "/" in f else f for f in fields)


def _row(result: dict[str, Any], extras: list[str]) -> str:
    ratios, cpu = result["ratios"], result["cpu_us_per_chunk"]
    ours = ratios["kvtier/vllm"]
    cells = [
        _size(result["chunk_bytes"]),
        f"{ours['store']:.2f}{TIMES}",
        f"{ours['load_hot']:.2f}{TIMES}",
        f"**{ours['load_cold']:.2f}{TIMES}**",
        f"{ratios['kvtier/raw']['load_cold']:.2f}",
        *(f"{ratios[f'{name}/vllm']['load_cold']:.2f}{TIMES}" for name in extras),
        f"{cpu['kvtier']['load_cold']:,} / {cpu['vllm']['load_cold']:,}",
    ]
    return "| " + " | ".join(cells) + " |"


def render(document: dict[str, Any]) -> str:
    """The table (kvtier over vLLM's fs tier unless a column says otherwise) and its source."""
    results = document["results"]
    extras = _extras(results[0])
    extra = "".join(f"cold, `{_label(name)}` / vLLM | " for name in extras)
    lines = [
        HEADER.format(extra=extra),
        "|" + "---|" * (6 + len(extras)),
        *(_row(result, extras) for result in results),
        "",
        f"Commit `{document.get('commit', 'unknown')}`, `{document.get('command', '?')}`; "
        f"{document['statistic']}, {document['threads']} threads, cold loads after "
        f"`{document['cold_cache']}`; load average {document['load_average_at_start'][0]} at "
        f"the start, {document['load_average_at_end'][0]} at the end.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, help="fs_vs_vllm.py's output")
    args = parser.parse_args()
    print(render(json.loads(args.json.read_text())))


if __name__ == "__main__":
    main()
