"""Known answers: unique prompts, a working set that fits the device pool, one that fits host
memory, and one whose reuse distances lie between host memory and disk."""

from __future__ import annotations

from kvtier.plan.analysis import GiB, MiB, PlanOptions, analyze
from kvtier.plan.cost import DEFAULTS
from kvtier.plan.verdict import DONT_TIER, HOST_AND_FS, HOST_ONLY, recommend
from tests.plan.helpers import cyclic_docs, unique_prompts

# 256-token chunks of 1 KiB per token: 256 KiB chunks; 300 documents x 4 chunks = 300 MiB
CHUNK = 256
BASE = PlanOptions(
    bytes_per_token=1024,
    chunk_tokens=CHUNK,
    engine_block_size=16,
    device_bytes=10 * 256 * 1024,
    host_memory=4 * GiB,
    page_cache_bytes=0,
)


def plan(trace, **changes):  # type: ignore[no-untyped-def]
    analysis = analyze(trace, PlanOptions(**{**vars(BASE), **changes}))
    return analysis, recommend(analysis, DEFAULTS)


def test_unique_prompts_mean_dont_tier() -> None:
    _, rec = plan(unique_prompts(2000, 4, CHUNK), process_bytes=1 * GiB)
    assert rec.verdict == DONT_TIER
    assert "100% of prompts are unique: no tier can help" in rec.reasons
    assert rec.predicted["recomputed"] == 1.0


def test_a_working_set_that_fits_the_device_pool_needs_no_tier() -> None:
    _, rec = plan(cyclic_docs(300, 4, 3000, CHUNK), device_bytes=1 * GiB, process_bytes=1 * GiB)
    assert rec.verdict == DONT_TIER
    assert "fits the device pool" in rec.reasons[0]
    assert rec.predicted["device"] > 0.85


def test_a_working_set_that_fits_host_memory_gets_host_only() -> None:
    analysis, rec = plan(cyclic_docs(300, 4, 3000, CHUNK), process_bytes=1 * GiB)
    assert rec.verdict == HOST_ONLY, rec.reasons
    assert rec.fs_max_bytes is None
    # cyclic reuse at 1200 chunks: host memory needs them all, and that is the knee
    assert rec.cpu_bytes_to_use == 1200 * analysis.slot_bytes
    assert rec.predicted["host"] > 0.85


def test_reuse_between_host_and_disk_size_adds_fs() -> None:
    # 2.75 GiB for the process and 1 GiB for the OS leave 256 MiB = 1024 chunks < 1200
    analysis, rec = plan(cyclic_docs(300, 4, 3000, CHUNK), process_bytes=2 * GiB + 768 * MiB)
    assert rec.verdict == HOST_AND_FS, rec.reasons
    assert rec.cpu_bytes_to_use <= 256 * MiB
    assert rec.fs_max_bytes is not None and rec.fs_max_bytes >= 1200 * analysis.chunk_bytes
    assert rec.predicted["fs"] > 0.85
    assert any("does not fit" in w for w in rec.warnings)


def test_fs_that_is_slower_than_recompute_is_not_recommended() -> None:
    from dataclasses import replace

    analysis, _ = plan(cyclic_docs(300, 4, 3000, CHUNK), process_bytes=2 * GiB + 768 * MiB)
    rec = recommend(analysis, replace(DEFAULTS, fs_read_bps=1e6))
    assert rec.verdict == DONT_TIER
    assert any("fs does not pay" in reason for reason in rec.reasons)
