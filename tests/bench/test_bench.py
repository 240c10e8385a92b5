"""The bench end to end on a tiny model: strategies agree with the ceiling, sources add up,
regimes show in where tokens came from, and the table, JSON and chart are written."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from kvtier.bench import provenance, report
from kvtier.bench.cli import options_from
from kvtier.bench.runner import Bench, BenchOptions, Sweep
from kvtier.cli.main import build_parser


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    torch.set_num_threads(1)
    options = BenchOptions(
        model="tiny",
        conversations=(1, 2, 4),
        device_convs=1.0,
        host_convs=2.0,
        first_prompt_tokens=40,
        rounds=2,
        user_turn_tokens=6,
        new_tokens=2,
        block_size=4,
        blocks_per_chunk=2,
        output_dir=str(tmp_path_factory.mktemp("bench")),
    )
    return Bench(options).sweep()


def one_round(tmp_path: Path) -> BenchOptions:
    """Two conversations of one round each, with the tiny model."""
    return BenchOptions(
        model="tiny",
        conversations=(2,),
        device_convs=1.0,
        host_convs=1.0,
        first_prompt_tokens=40,
        rounds=1,
        user_turn_tokens=6,
        new_tokens=2,
        block_size=4,
        blocks_per_chunk=2,
        output_dir=str(tmp_path),
    )


def at(sweep: Sweep, n: int) -> dict[str, Any]:
    return {r.strategy: r for r in sweep.results if r.num_conversations == n}


def test_every_strategy_answers_like_the_ceiling(sweep: Sweep) -> None:
    assert sweep.strategies == ["recompute", "host", "host+fs", "ceiling"]
    for row in report.rows(sweep):
        assert row["answers_equal_to_ceiling"] == 1.0, row


def test_sources_count_every_prompt_token(sweep: Sweep) -> None:
    for result in sweep.results:
        assert sum(result.sources.values()) == result.tokens - result.num_conversations * 3 * 2


def test_each_regime_is_served_by_its_tier(sweep: Sweep) -> None:
    """1 conversation: the accelerator pool; 2: host memory; 4: only the filesystem tier."""
    one, two, four = at(sweep, 1), at(sweep, 2), at(sweep, 4)
    assert one["recompute"].sources == one["ceiling"].sources
    assert two["recompute"].sources["recomputed"] > two["ceiling"].sources["recomputed"]
    assert two["host"].sources["recomputed"] == two["ceiling"].sources["recomputed"]
    assert four["host"].sources["recomputed"] > four["ceiling"].sources["recomputed"]
    assert four["host+fs"].sources["fs"] > 0
    assert four["host+fs"].sources["recomputed"] == four["ceiling"].sources["recomputed"]


def test_reports_are_written(sweep: Sweep, tmp_path: Path) -> None:
    table = report.rows(sweep)
    text = report.format_table(table)
    assert all(name in text for name in sweep.strategies)
    document = report.to_json(sweep, table)
    provenance.write_json(document, tmp_path / "bench.json")
    report.write_chart(sweep, table, tmp_path / "bench.png")
    loaded = json.loads((tmp_path / "bench.json").read_text())
    assert next(iter(loaded)) == "run" and loaded["run"]["kvtier_version"]
    assert loaded["headline"]["conversations"] == 4
    assert len(loaded["results"]) == 12
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "throughput of recompute" in report.format_headline(loaded["headline"])


def test_default_filesystem_directories_are_removed(sweep: Sweep) -> None:
    assert not list((Path(sweep.options.output_dir) / "tiers").glob("run-*"))


def test_command_line_options() -> None:
    parse = build_parser().parse_args
    assert options_from(parse(["bench"])) == BenchOptions()
    quick = options_from(parse(["bench", "--quick", "--rounds", "2", "--conversations", "3,5"]))
    assert quick.conversations == (3, 5) and quick.rounds == 2 and quick.host_convs == 4.0
    with pytest.raises(SystemExit):
        parse(["bench", "--conversations", "0,2"])


def test_metrics_port_serves_the_fullest_strategy(tmp_path: Path) -> None:
    import socket
    import urllib.request

    from kvtier.bench.cli import _export_metrics

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bench = Bench(one_round(tmp_path))
    server = _export_metrics(bench, port)
    try:
        sweep = bench.sweep()
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.close()
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("kvtier_") and " " in line
    }
    assert samples["kvtier_stored_chunks_total"] > 0
    assert samples['kvtier_tier_bytes_total{op="store",tier="fs"}'] > 0
    (full,) = [r for r in sweep.results if r.strategy == "host+fs"]
    for source in ("accelerator", "host", "fs"):
        exported = samples.get(f'kvtier_prompt_tokens_total{{source="{source}"}}', 0)
        assert exported == full.sources[source], source


def test_warm_up_freezes_the_heap_so_far(tmp_path: Path) -> None:
    """A full collection of the start-up objects must not land on one strategy's request."""
    gc.unfreeze()
    try:
        Bench(one_round(tmp_path)).warm_up()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
