"""The conversation workload: interleaving, growing histories, and its own size arithmetic."""

from __future__ import annotations

import pytest

from kvtier.bench.mixed import MixedSpec, MixedWorkload
from kvtier.bench.workload import Workload, WorkloadSpec, schedule


def test_requests_interleave_turn_by_turn() -> None:
    """Every conversation has turn t before any has turn t + 1; orders differ between rounds."""
    spec = WorkloadSpec(num_conversations=6, rounds=3, seed=1)
    order = schedule(spec)
    assert len(order) == spec.num_requests == 24
    turns = [turn for _, turn in order]
    assert turns == sorted(turns)
    rounds = [[c for c, t in order if t == turn] for turn in range(spec.turns)]
    assert all(sorted(r) == list(range(6)) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1


def test_prompts_grow_by_the_answer_and_a_user_turn() -> None:
    spec = WorkloadSpec(
        num_conversations=2,
        first_prompt_tokens=20,
        rounds=2,
        user_turn_tokens=5,
        new_tokens=3,
        vocab_size=50,
    )
    workload = Workload(spec)
    last: dict[int, list[int]] = {}
    for request in workload:
        if request.turn == 0:
            assert len(request.prompt) == 20
        else:
            previous = last[request.conversation]
            assert request.prompt[: len(previous)] == previous
            assert len(request.prompt) == len(previous) + 5
        answer = [request.turn] * spec.new_tokens
        workload.answer(request, answer)
        last[request.conversation] = request.prompt + answer
    assert {len(h) for h in last.values()} == {spec.max_context_tokens}


def test_same_seed_same_prompts() -> None:
    spec = WorkloadSpec(num_conversations=3, first_prompt_tokens=8, rounds=1)
    first = [r.prompt for r in Workload(spec)]
    assert first == [r.prompt for r in Workload(spec)]
    assert len({tuple(p) for p in first[:3]}) == 3  # conversations differ from each other


def test_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rounds"):
        WorkloadSpec(num_conversations=2, rounds=0)


@pytest.mark.parametrize("make", [Workload, lambda spec: MixedWorkload(MixedSpec(spec, 2, 8))])
def test_upcoming_is_the_next_prompt_wherever_no_answer_can_change_it(make) -> None:
    """The next request's prompt, known ahead while the current one runs: equal to the prompt
    handed out next, and ``None`` where the next turn is the same conversation's (its history
    still lacks the current answer) and after the last request."""
    spec = WorkloadSpec(num_conversations=3, first_prompt_tokens=8, rounds=3, seed=3)
    workload = make(spec)
    assert workload.upcoming() is None  # nothing handed out yet
    requests = iter(workload)
    request = next(requests)
    seen = same = 0
    while request is not None:
        upcoming = workload.upcoming()
        workload.answer(request, [request.turn, request.conversation])
        following = next(requests, None)
        if following is None or following.conversation == request.conversation:
            same += following is not None
            assert upcoming is None
        else:
            seen += 1
            assert upcoming == following.prompt
        request = following
    assert seen > 0 and same > 0  # seed 3: a round ends and the next starts with one conversation
