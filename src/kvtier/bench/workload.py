"""The multi-turn conversation workload of ``kvtier bench``.

``num_conversations`` conversations each open with a long first prompt (a system prompt plus a
document, say: ``first_prompt_tokens``), then run ``rounds`` more turns; each turn appends the
model's previous answer and a new user message (``user_turn_tokens``) and asks for
``new_tokens`` more. Turn 0 of every conversation comes first, then round after round; within
a round the conversations come in a fresh random order, so requests interleave and a
conversation's next turn arrives after about ``num_conversations - 1`` other requests.

Token ids are random (the models have random weights); a conversation's tokens depend only on
the seed and its index, so every strategy of a run serves exactly the same prompts as long as
the model answers the same.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkloadSpec:
    """Sizes of the workload; every count is positive."""

    num_conversations: int
    first_prompt_tokens: int = 768
    rounds: int = 4
    user_turn_tokens: int = 32
    new_tokens: int = 2
    vocab_size: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if name != "seed" and value <= 0:
                raise ValueError(f"{name}: expected a positive integer, got {value}")

    @property
    def turns(self) -> int:
        return self.rounds + 1

    @property
    def num_requests(self) -> int:
        return self.num_conversations * self.turns

    @property
    def max_context_tokens(self) -> int:
        """Tokens of a conversation's last prompt plus its answer: its largest KV."""
        return (
            self.first_prompt_tokens
            + self.rounds * self.user_turn_tokens
            + (self.turns * self.new_tokens)
        )


@dataclass(frozen=True)
class Request:
    conversation: int
    turn: int
    prompt: list[int] = field(repr=False)


class Workload:
    """Hands out the requests of a ``WorkloadSpec`` in order, once; ``answer`` extends the
    history.

    Each request's prompt is built when it is handed out, from the answers recorded so far, so
    call ``answer`` for a request before asking for the next one. ``upcoming`` is the prompt
    of the request after that one, where it is already known (a serving engine's queue).
    """

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self._history: list[list[int]] = [[] for _ in range(spec.num_conversations)]
        self._order = self.order()
        self._served = 0

    def order(self) -> list[tuple[int, int]]:
        """(conversation, turn) of every request, in serving order."""
        return schedule(self.spec)

    def __iter__(self) -> Iterator[Request]:
        while self._served < len(self._order):
            conversation, turn = self._order[self._served]
            self._served += 1
            yield Request(conversation, turn, self.prompt(conversation, turn))

    def upcoming(self) -> list[int] | None:
        """The prompt of the request after the last one handed out, if no answer still due can
        change it (it belongs to another conversation); ``None`` otherwise or at the end."""
        if not 0 < self._served < len(self._order):
            return None
        (last, _), (conversation, turn) = self._order[self._served - 1 : self._served + 1]
        return None if conversation == last else self.prompt(conversation, turn)

    def prompt(self, conversation: int, turn: int) -> list[int]:
        """The prompt of ``turn`` of ``conversation``, from the answers recorded so far."""
        return self._history[conversation] + self._user_turn(conversation, turn)

    def answer(self, request: Request, tokens: list[int]) -> None:
        """Record the model's answer to ``request``: the conversation now ends with it."""
        self._history[request.conversation] = request.prompt + tokens

    def _user_turn(self, conversation: int, turn: int) -> list[int]:
        spec = self.spec
        rng = random.Random(f"{spec.seed}/{conversation}/{turn}")
        length = spec.first_prompt_tokens if turn == 0 else spec.user_turn_tokens
        return [rng.randrange(spec.vocab_size) for _ in range(length)]


def schedule(spec: WorkloadSpec) -> list[tuple[int, int]]:
    """(conversation, turn) pairs in serving order: turn by turn, conversations shuffled."""
    rng = random.Random(spec.seed)
    order: list[tuple[int, int]] = []
    for turn in range(spec.turns):
        conversations = list(range(spec.num_conversations))
        rng.shuffle(conversations)
        order += [(conversation, turn) for conversation in conversations]
    return order
