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
seed, so no phase is served what an earlier one stored. After a phase, before ``DONE``, the
runner waits for its fs directory to stop growing and syncs (``settle_writes``), so the next
strategy's phase does not pay for this one's trailing writes. Within a phase ``concurrency``
requests are in flight: a finished request is replaced at once by the next one in the
workload's order whose conversation has no request in flight (its next turn needs the answer).
Greedy decoding, ``ignore_eos``: every request generates exactly ``new_tokens`` tokens.

The output JSON has, per phase: its round, every request's answer, TTFT and inter-token gaps
(seconds, measured at ``LLMEngine.step`` returns), the phase's wall seconds and tokens, the CPU
seconds the runner and its child processes spent in it (``tree_cpu_seconds``), the seconds
it then waited for its trailing writes (``settle_seconds``), how much every
vLLM counter grew (``name{label=value,...}``) and the bytes under each of ``disk_dirs``. With
``kvtier_metrics_port`` (kvtier's operator plane on in the engine), ``operator_plane``: what
kvtier's ``/metrics`` and ``/admin/tiers`` served there once every phase was done
(``scrape_operator_plane``).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import sys
import time
import urllib.request
from typing import Any

from kvtier.bench.phase import (
    ONE_SHOT,
    Flight,
    finished,
    one_shot_prompt,
    order,
    settle_writes,
    tree_bytes,
    tree_cpu_seconds,
    user_turn,
)


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
        phases[index]["settle_seconds"] = settle_writes(scenario.get("disk_dirs", {}).values())
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
