"""One phase of the engine benches (``--engine vllm``, ``--engine sglang``): its requests, their
order, and what it measures; engine-neutral, imported by the engines' own processes too.

A phase is a dict (``phases`` builds them): ``round``, ``conversations`` N,
``first_prompt_tokens``, ``rounds``, ``user_turn_tokens``, ``new_tokens``, ``vocab_size``,
``seed``, ``one_shots``, ``one_shot_tokens``. Its requests are the multi-turn workload's
(``workload.schedule``) with one-shots spread evenly among them (``order``); every token is
fixed by the phase's seed, so every strategy is asked the same prompts as long as the model
answers the same. A served request is reported by ``finished``: its key, prompt length,
answer, TTFT and inter-token gaps.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import random
import resource
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kvtier.bench.workload import WorkloadSpec, schedule

ONE_SHOT = -1  # the conversation number of one-shot requests
ROUND_SEED_STEP = 1_000_003  # a prime: round r's seeds are far from every other round's


def phases(options: Any, vocab_size: int) -> list[dict[str, Any]]:
    """The workload of every round and N of ``options`` (an engine bench's options), round by
    round (phase ``r * len(N) + i`` is round ``r``'s ``i``-th N); its seed depends on N and the
    round, so no phase reuses another's prefixes (round 0's seeds are those of a run without
    ``--repeat``)."""
    o = options
    return [
        {
            "round": r,
            "conversations": n,
            "first_prompt_tokens": o.first_prompt_tokens,
            "rounds": o.rounds,
            "user_turn_tokens": o.user_turn_tokens,
            "new_tokens": o.new_tokens,
            "vocab_size": min(vocab_size, 32_000),
            "seed": o.seed * 100_003 + n + r * ROUND_SEED_STEP,
            "one_shots": n if o.mix else 0,
            "one_shot_tokens": o.one_shot_tokens,
        }
        for r in range(o.repeats)
        for n in o.conversations
    ]


@dataclass
class Flight:
    """One request in flight: when it was added and when each of its tokens arrived."""

    key: str
    conversation: int
    prompt: list[int]
    added: float
    token_times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def user_turn(phase: dict[str, Any], conversation: int, turn: int) -> list[int]:
    """A conversation's new user tokens (the first prompt at turn 0), fixed by the seed."""
    rng = random.Random(f"{phase['seed']}/{conversation}/{turn}")
    length = phase["first_prompt_tokens"] if turn == 0 else phase["user_turn_tokens"]
    return [rng.randrange(10, phase["vocab_size"]) for _ in range(length)]


def order(phase: dict[str, Any]) -> list[tuple[int, int]]:
    """(conversation, turn) in serving order; one-shots (``ONE_SHOT``, index) spread evenly."""
    spec = WorkloadSpec(
        num_conversations=phase["conversations"], rounds=phase["rounds"], seed=phase["seed"]
    )
    turns = schedule(spec)
    shots = phase.get("one_shots", 0)
    if not shots:
        return turns
    mixed: list[tuple[int, int]] = []
    left, every = list(range(shots)), max(1, len(turns) // shots)
    for i, item in enumerate(turns):
        mixed.append(item)
        if (i + 1) % every == 0 and left:
            mixed.append((ONE_SHOT, left.pop(0)))
    mixed += [(ONE_SHOT, index) for index in left]
    return mixed


def one_shot_prompt(phase: dict[str, Any], index: int) -> list[int]:
    rng = random.Random(f"{phase['seed']}/one-shot/{index}")
    return [rng.randrange(10, phase["vocab_size"]) for _ in range(phase["one_shot_tokens"])]


def finished(flight: Flight) -> dict[str, Any]:
    times = flight.token_times
    return {
        "key": flight.key,
        "one_shot": flight.conversation == ONE_SHOT,
        "prompt_tokens": len(flight.prompt),
        "tokens": flight.tokens,
        "ttft_s": times[0] - flight.added if times else None,
        "itl_s": [b - a for a, b in itertools.pairwise(times)],
    }


def _pids_under(pid: int) -> list[int]:
    """``pid`` and every process below it, from ``/proc/<pid>/task/*/children``."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        for task in glob.glob(f"/proc/{current}/task/*/children"):
            with contextlib.suppress(OSError), open(task) as file:
                todo += [int(child) for child in file.read().split()]
    return out


def tree_cpu_seconds(root: int | None = None) -> float:
    """User and system CPU seconds of process ``root`` (default: this one) and every process
    below it (an engine's cores and workers run in children), from ``/proc/<pid>/stat``; this
    process alone (``resource``) where ``/proc`` has no ``children`` file. A process that exits
    between two readings takes its time with it, so only differences over a phase are
    meaningful."""
    root = os.getpid() if root is None else root
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in _pids_under(root):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / ticks


def tree_bytes(root: str) -> int:
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(directory, name))
    return total


#: ``settle_writes``: how long the files must stop growing, and the longest it waits.
SETTLE_QUIET_S, SETTLE_LIMIT_S = 0.25, 10.0


def quiet_bytes(dirs: Iterable[str], quiet_s: float, limit_s: float) -> int:
    """The bytes under ``dirs`` once they have not grown for ``quiet_s``, or when ``limit_s``
    ran out first (a tier that never stops writing is not waited for for ever). Polls five
    times per ``quiet_s``; a directory that does not exist holds 0 bytes."""
    folders = list(dirs)
    start = now = time.perf_counter()
    size, since = sum(map(tree_bytes, folders)), start
    while folders and now - since < quiet_s and now - start < limit_s:
        time.sleep(quiet_s / 5)
        grown, now = sum(map(tree_bytes, folders)), time.perf_counter()
        if grown != size:
            size, since = grown, now
    return size


def settle_writes(
    dirs: Iterable[str],
    quiet_s: float = SETTLE_QUIET_S,
    limit_s: float = SETTLE_LIMIT_S,
    sync: Callable[[], None] = os.sync,
) -> float:
    """``quiet_bytes``, then ``sync``; the seconds it took. A tier writes a phase's chunks
    after the requests that made them finished: without this, those writes and their writeback
    would run in the next strategy's phase on a small machine, and a ratio of two strategies
    would measure them. Runs after a phase's clock stopped, so it adds nothing to the phase's
    figures."""
    start = time.perf_counter()
    quiet_bytes(dirs, quiet_s, limit_s)
    sync()
    return time.perf_counter() - start
