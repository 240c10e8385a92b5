"""The transformers integration's share of issue 15: a request's retention priority reaches host
memory (``prepare_store``/``touch``), its latencies reach the SLO guard (``report_request``), and
the chunks it stores are numbered in their prefix (``min_prefix_chunks``).

Real (tiny, random-weight) Llama and Qwen2 models from ``conftest``; chunks are 8 tokens. A
32-token prompt with 4 generated tokens stores 4 chunks.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from kvtier import CacheIdentity, TieringConfig, TieringManager
from kvtier.errors import InvalidArgumentError
from kvtier.integrations.transformers import TieredModel
from kvtier.region import ALIGNMENT, round_up

NEW_TOKENS = 4


def prompt(length: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (length,), generator=gen).tolist()


def build(identity: CacheIdentity, host_slots: int, **config: Any) -> TieringManager:
    stride = round_up(identity.layout.chunk_bytes, ALIGNMENT)
    full = {"cpu_bytes_to_use": host_slots * stride, **config}
    return TieringManager(TieringConfig.from_dict(full), identity)


def serve(tiered: TieredModel, tokens: list[int], **retention: Any) -> Any:
    result = tiered.generate(tokens, NEW_TOKENS, **retention)
    tiered.flush()
    assert tiered.manager is not None and tiered.manager.wait_idle(10)
    return result


def evict_after(tiered: TieredModel, **retention: Any) -> dict[str, int]:
    """Serve A (with ``retention``), then B and C (4 chunks each) into 8 host slots, then A's
    follow-up: where its 32-token prefix came from."""
    first = prompt(32, seed=1)
    serve(tiered, first, **retention)
    serve(tiered, prompt(32, seed=2))
    serve(tiered, prompt(32, seed=3))  # 4 of the 8 slots must go: A's (oldest) or B's
    return dict(serve(tiered, first + prompt(5, seed=4)).sources)


def test_without_priority_the_oldest_request_is_evicted(
    model: Any, identity: CacheIdentity
) -> None:
    with build(identity, host_slots=8) as manager:
        sources = evict_after(TieredModel(model, identity, manager))
    assert sources == {"accelerator": 0, "recomputed": 37}


def test_a_high_priority_request_outlives_newer_ones(model: Any, identity: CacheIdentity) -> None:
    with build(identity, host_slots=8) as manager:
        sources = evict_after(TieredModel(model, identity, manager), priority=90)
    assert sources == {"accelerator": 0, "host": 32, "recomputed": 5}


def test_an_expired_priority_falls_back_to_the_default(model: Any, identity: CacheIdentity) -> None:
    with build(identity, host_slots=8) as manager:
        tiered = TieredModel(model, identity, manager)
        first = prompt(32, seed=1)
        serve(tiered, first, priority=90, duration_s=0.01)
        time.sleep(0.05)  # the priority has ended: A is just the oldest request again
        serve(tiered, prompt(32, seed=2))
        serve(tiered, prompt(32, seed=3))
        sources = serve(tiered, first + prompt(5, seed=4)).sources
    assert sources == {"accelerator": 0, "recomputed": 37}


@pytest.mark.parametrize(
    "retention",
    [
        {"priority": 101},
        {"priority": -1},
        {"priority": [90]},
        {"priority": True},
        {"priority": 50.0},
        {"duration_s": 0.0},
        {"duration_s": float("nan")},
    ],
)
def test_bad_retention_is_refused_before_any_work(
    model: Any, identity: CacheIdentity, retention: dict[str, Any]
) -> None:
    with build(identity, host_slots=8) as manager:
        tiered = TieredModel(model, identity, manager)
        with pytest.raises(InvalidArgumentError):
            tiered.generate(prompt(32, seed=1), NEW_TOKENS, **retention)
        assert manager.stats()["counters"] == {}


def test_every_request_reports_its_latencies(
    model: Any, identity: CacheIdentity, monkeypatch: pytest.MonkeyPatch
) -> None:
    with build(identity, host_slots=8) as manager:
        reported: list[tuple[float | None, float | None]] = []
        monkeypatch.setattr(
            manager,
            "report_request",
            lambda ttft_s=None, itl_s=None: reported.append((ttft_s, itl_s)),
        )
        tiered = TieredModel(model, identity, manager)
        several = tiered.generate(prompt(20, seed=1), NEW_TOKENS)
        one = tiered.generate(prompt(20, seed=2), 1)
    assert reported == [(several.first_token_s, several.inter_token_s), (one.first_token_s, None)]
    assert several.inter_token_s is not None and several.inter_token_s > 0
    assert one.inter_token_s is None


def test_the_slo_guard_trips_on_reported_ttft(model: Any, identity: CacheIdentity) -> None:
    """A TTFT budget no request can meet (1 ns) switches the newest tier off."""
    guard = {"ttft_p99_s": 1e-9, "min_samples": 1, "sustain_s": 1e-6, "cooldown_s": 3600}
    with build(
        identity, host_slots=8, slo_guard=guard, secondary_tiers=[{"type": "memory"}]
    ) as manager:
        tiered = TieredModel(model, identity, manager)
        for seed in range(3):
            serve(tiered, prompt(20, seed=seed))
            manager.poll()
        assert manager.tier_states() == ([], ["memory"])
        switches = manager.take_tier_switches()
    assert [(s.tier, s.enabled, s.reason) for s in switches] == [("memory", False, "ttft_p99")]


def test_stored_chunks_are_numbered_in_their_prefix(model: Any, identity: CacheIdentity) -> None:
    """``min_prefix_chunks: 3``: a 2-chunk prompt is not kept, but the 2 new chunks of a
    follow-up after a 4-chunk cached prefix are (chunks 4 and 5 of their prefix)."""
    admission = [{"level": "host", "min_prefix_chunks": 3}]
    with build(identity, host_slots=16, admission=admission) as manager:
        tiered = TieredModel(model, identity, manager)
        assert serve(tiered, prompt(16, seed=1)).sources == {"accelerator": 0, "recomputed": 16}
        first = prompt(32, seed=2)
        serve(tiered, first)
        follow_up = first + prompt(16, seed=3)
        assert serve(tiered, follow_up).sources["host"] == 32
        longer = serve(tiered, follow_up + prompt(3, seed=4)).sources
        counters = manager.stats()["counters"]
    assert longer == {"accelerator": 0, "host": 48, "recomputed": 3}
    assert counters["kvtier_admission_dropped_total{reason=min_prefix_chunks,tier=host}"] == 2
