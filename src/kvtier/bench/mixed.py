"""The mixed workload of ``kvtier bench --admission``: reused conversations among one-shot prompts.

The conversations are those of ``workload`` (a long first prompt, then ``rounds`` more turns,
each appending the previous answer and a user message). Each round also carries
``one_shots_per_round`` one-shot prompts of ``one_shot_tokens`` random tokens: prompts nobody
ever sends again (a unique document, a single question), whose chunks can never be reused.
Within a round the conversations' turns and the one-shots come in a fresh random order.

This is the regime admission is for: without it, every one-shot chunk is stored like a reused
one, and enough of them between two turns of a conversation flush the conversation's prefix out
of host memory (LRU keeps the most recent chunks, not the useful ones).

One-shot requests carry conversation numbers from ``num_conversations`` on and turn 0, so
``Request.turn > 0`` still marks exactly the follow-up turns of reused conversations.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvtier.bench.workload import Request, Workload, WorkloadSpec


@dataclass(frozen=True)
class MixedSpec:
    """``conversations`` plus ``one_shots_per_round`` one-shot prompts per round (may be 0)."""

    conversations: WorkloadSpec
    one_shots_per_round: int = 16
    one_shot_tokens: int = 768

    def __post_init__(self) -> None:
        if self.one_shots_per_round < 0 or self.one_shot_tokens <= 0:
            raise ValueError("one-shots: expected a count >= 0 and a positive prompt length")

    @property
    def num_one_shots(self) -> int:
        return self.one_shots_per_round * self.conversations.turns

    @property
    def num_requests(self) -> int:
        return self.conversations.num_requests + self.num_one_shots


class MixedWorkload(Workload):
    """A ``Workload`` whose rounds also carry one-shot prompts (``MixedSpec``).

    As with ``Workload``, call ``answer`` for a request before asking for the next one; answers
    to one-shot prompts are not kept (nobody follows them up).
    """

    def __init__(self, spec: MixedSpec) -> None:
        self.mixed = spec
        super().__init__(spec.conversations)

    def order(self) -> list[tuple[int, int]]:
        return mixed_schedule(self.mixed)

    def prompt(self, conversation: int, turn: int) -> list[int]:
        conversations = self.spec.num_conversations
        if conversation >= conversations:
            return self._one_shot(conversation - conversations)
        return super().prompt(conversation, turn)

    def answer(self, request: Request, tokens: list[int]) -> None:
        if request.conversation < self.spec.num_conversations:
            super().answer(request, tokens)

    def _one_shot(self, index: int) -> list[int]:
        spec = self.spec
        rng = random.Random(f"{spec.seed}/one-shot/{index}")
        return [rng.randrange(spec.vocab_size) for _ in range(self.mixed.one_shot_tokens)]


def mixed_schedule(spec: MixedSpec) -> list[tuple[int, int]]:
    """(conversation, turn) pairs in serving order; one-shot ``k`` is ``(N + k, 0)``.

    Round ``t`` holds turn ``t`` of every conversation and the next ``one_shots_per_round``
    one-shots, shuffled together.
    """
    conversations = spec.conversations
    rng = random.Random(f"{conversations.seed}/mixed")
    order: list[tuple[int, int]] = []
    first_one_shot = conversations.num_conversations
    for turn in range(conversations.turns):
        round_ = [(c, turn) for c in range(conversations.num_conversations)]
        start = first_one_shot + turn * spec.one_shots_per_round
        round_ += [(start + k, 0) for k in range(spec.one_shots_per_round)]
        rng.shuffle(round_)
        order += round_
    return order
