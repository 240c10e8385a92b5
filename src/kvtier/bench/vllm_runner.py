"""One vLLM engine serving the multi-turn workload with concurrent requests (vLLM venv side).

``python -m kvtier.bench.vllm_runner SCENARIO.json`` runs in the vLLM venv's python (with
kvtier's ``src`` on ``PYTHONPATH``); kvtier's own process never imports vLLM, and drives the
runner over stdin/stdout (see ``main``), one phase at a time. The scenario::

    {"model": DIR, "load_format": "dummy" | "auto", "dtype": "float32", "engine_id": ID,
     "kv_cache_memory_bytes": N, "max_model_len": N, "kv_transfer_config": {...} | null,
     "concurrency": N, "phases": [{"conversations": N, "first_prompt_tokens": N, "rounds": N,
     "user_turn_tokens": N, "new_tokens": N, "vocab_size": N, "seed": N,
     "one_shots": N, "one_shot_tokens": N}, ...],
     "disk_dirs": {"label": DIR, ...}, "output": PATH, "kvtier_metrics_port": N (optional)}

Every phase starts from an empty device prefix cache (``reset_prefix_cache``) and uses its own
seed, so no phase is served what an earlier one stored. Within a phase ``concurrency`` requests
are in flight: a finished request is replaced at once by the next one in the workload's order
whose conversation has no request in flight (its next turn needs the answer). Greedy decoding,
``ignore_eos``: every request generates exactly ``new_tokens`` tokens.

The output JSON has, per phase: its round, every request's answer, TTFT and inter-token gaps
(seconds, measured at ``LLMEngine.step`` returns), the phase's wall seconds and tokens, the CPU
seconds the runner and its child processes spent in it (``tree_cpu_seconds``), how much every
vLLM counter grew (``name{label=value,...}``) and the bytes under each of ``disk_dirs``. With
``kvtier_metrics_port`` (kvtier's operator plane on in the engine), ``operator_plane``: what
kvtier's ``/metrics`` and ``/admin/tiers`` served there once every phase was done
(``scrape_operator_plane``).
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import itertools
import json
import os
import random
import resource
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from kvtier.bench.workload import WorkloadSpec, schedule

ONE_SHOT = -1  # the conversation number of one-shot requests


@dataclass
class Flight:
    """One request in flight: when it was added and when each of its tokens arrived."""

    key: str
    conversation: int
    prompt: list[int]
    added: float
    token_times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def counters(llm: Any) -> dict[str, float]:
    """Every counter and gauge of the engine, keyed ``name{label=value,...}``."""
    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        value = getattr(metric, "value", None)
        if isinstance(value, int | float):
            labels = ",".join(f"{k}={v}" for k, v in sorted(metric.labels.items()))
            out[f"{metric.name}{{{labels}}}"] = float(value)
    return out


def grown(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def stop(llm: Any) -> None:
    """Stop the engine, giving its teardown time: by default vLLM kills its engine core 5 s
    after SIGTERM, which can cut the tiering manager's shutdown of the secondary tiers short."""
    llm.llm_engine.engine_core.shutdown(timeout=60)


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


def engine(scenario: dict[str, Any]) -> Any:
    """The ``LLM`` of the scenario: float32, eager, prefix caching, no tokenizer needed."""
    llm_class = importlib.import_module("vllm").LLM
    kwargs: dict[str, Any] = {}
    if scenario.get("kv_transfer_config"):
        kwargs["kv_transfer_config"] = scenario["kv_transfer_config"]
    return llm_class(
        model=scenario["model"],
        load_format=scenario["load_format"],
        dtype=scenario["dtype"],
        max_model_len=scenario["max_model_len"],
        enforce_eager=True,
        enable_prefix_caching=True,
        disable_log_stats=False,
        skip_tokenizer_init=True,
        seed=0,
        kv_cache_memory_bytes=scenario["kv_cache_memory_bytes"],
        max_num_seqs=max(scenario["concurrency"], 1),
        **kwargs,
    )


def params(new_tokens: int) -> Any:
    sampling = importlib.import_module("vllm").SamplingParams
    return sampling(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, detokenize=False)


def run_phase(llm: Any, phase: dict[str, Any], concurrency: int) -> dict[str, Any]:
    """Serve one phase's requests with ``concurrency`` in flight; see the module docstring."""
    core = llm.llm_engine
    pending = order(phase)
    history: dict[int, list[int]] = {c: [] for c in range(phase["conversations"])}
    flights: dict[str, Flight] = {}
    done: list[dict[str, Any]] = []
    sampling = params(phase["new_tokens"])
    before, start, cpu = counters(llm), time.perf_counter(), tree_cpu_seconds()
    while pending or flights:
        busy = {f.conversation for f in flights.values()}
        while pending and len(flights) < concurrency:
            pick = next((i for i, (c, _) in enumerate(pending) if c not in busy), None)
            if pick is None:
                break
            conversation, turn = pending.pop(pick)
            if conversation == ONE_SHOT:
                key, prompt = f"one-shot/{turn}", one_shot_prompt(phase, turn)
            else:
                key = f"{conversation}/{turn}"
                prompt = history[conversation] + user_turn(phase, conversation, turn)
            busy.add(conversation)
            flights[key] = Flight(key, conversation, prompt, time.perf_counter())
            core.add_request(key, {"prompt_token_ids": prompt}, sampling)
        for output in core.step():
            flight, now = flights[output.request_id], time.perf_counter()
            tokens = list(output.outputs[0].token_ids)
            flight.token_times += [now] * (len(tokens) - len(flight.tokens))
            flight.tokens = tokens
            if output.finished:
                del flights[output.request_id]
                if flight.conversation != ONE_SHOT:
                    history[flight.conversation] = flight.prompt + tokens
                done.append(finished(flight))
    seconds = time.perf_counter() - start
    return {
        "round": phase.get("round", 0),
        "conversations": phase["conversations"],
        "seconds": seconds,
        "cpu_seconds": tree_cpu_seconds() - cpu,
        "requests": done,
        "grown": grown(before, counters(llm)),
    }


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


def tree_cpu_seconds() -> float:
    """User and system CPU seconds of this process and every process below it (vLLM's engine
    core and workers run in children), from ``/proc/<pid>/stat``; this process alone
    (``resource``) where ``/proc`` has no ``children`` file. A process that exits between two
    readings takes its time with it, so only differences over a phase are meaningful."""
    if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in _pids_under(os.getpid()):
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


#: kvtier families ``scrape_operator_plane`` sums (all samples of each, every label).
PLANE_FAMILIES = ("kvtier_tier_chunks_total", "kvtier_tier_disabled_total", "kvtier_tier_enabled")


def scrape_operator_plane(port: int) -> dict[str, Any]:
    """``served``: whether ``127.0.0.1:port`` answered ``/metrics`` and ``/admin/tiers``; then
    the sum of each of ``PLANE_FAMILIES``' samples, the tiers' states and the text's size."""
    base = f"http://127.0.0.1:{port}"
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as answer:
            text = answer.read().decode()
        with urllib.request.urlopen(f"{base}/admin/tiers", timeout=30) as answer:
            tiers = json.loads(answer.read())
    except OSError as exc:
        return {"served": False, "error": repr(exc)}
    sums = dict.fromkeys(PLANE_FAMILIES, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in sums:
            sums[name] += float(line.rsplit(" ", 1)[1])
    return {"served": True, "metrics_bytes": len(text), "sums": sums, "admin_tiers": tiers}


def warm_up(llm: Any, phase: dict[str, Any]) -> None:
    """A first-prompt-sized request outside the measurement (first-call costs, the connector's
    first stores), then an empty device prefix cache."""
    rng = random.Random("warm-up")
    prompt = [rng.randrange(10, phase["vocab_size"]) for _ in range(phase["first_prompt_tokens"])]
    llm.generate([{"prompt_token_ids": prompt}], params(2), use_tqdm=False)
    llm.reset_prefix_cache()


def main(path: str) -> None:
    """Build the engine, say ``READY``, then serve phase ``I`` for every line ``I`` on stdin
    (answering ``DONE``) until ``EXIT``; then write the report.

    The replies go to the original stdout; everything else printed to stdout (vLLM's logs)
    is sent to stderr, so the two never mix.
    """
    with open(path) as file:
        scenario = json.load(file)
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    started = time.perf_counter()
    llm = engine(scenario)
    loaded = time.perf_counter() - started
    warm_up(llm, scenario["phases"][0])
    phases: dict[int, dict[str, Any]] = {}
    print("READY", file=replies)
    for line in sys.stdin:
        if line.strip() == "EXIT":
            break
        index = int(line)
        llm.reset_prefix_cache()
        phases[index] = run_phase(llm, scenario["phases"][index], scenario["concurrency"])
        print(f"phase N={phases[index]['conversations']}: {phases[index]['seconds']:.1f}s")
        print("DONE", file=replies)
    disk = {label: tree_bytes(d) for label, d in scenario.get("disk_dirs", {}).items()}
    report = {
        "load_seconds": loaded,
        "phases": [phases[i] for i in sorted(phases)],
        "disk_bytes": disk,
        "total_seconds": time.perf_counter() - started,
    }
    if scenario.get("kvtier_metrics_port"):
        report["operator_plane"] = scrape_operator_plane(scenario["kvtier_metrics_port"])
    with open(scenario["output"], "w") as file:
        json.dump(report, file)
    stop(llm)


if __name__ == "__main__":
    main(sys.argv[1])
