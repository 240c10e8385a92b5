"""The client side of ``kvtier bench --engine sglang``: a phase served over SGLang's HTTP API.

``run_phase(server, phase, concurrency)`` asks a running SGLang server for a phase's requests
(``phase.order``) with ``concurrency`` in flight: each worker thread takes the next request in
the workload's order whose conversation has no request in flight (its next turn needs the
answer), and sends it to ``/generate`` as token ids, streamed, greedy, ``ignore_eos``. TTFT and
inter-token gaps are measured when the stream's chunks arrive; every request's
``cached_tokens_details`` (prompt tokens SGLang matched on the device, in host memory, from
L3) is kept. The phase report is the vLLM runner's (``engine_report``'s input) with
``finals``: each conversation's last prompt, for ``replay``.

``replay(server, prompts)`` asks for each prompt once, one at a time, after the caller flushed
SGLang's L1 and L2, and counts the prompt tokens SGLang asked L3 for
(``sglang_strategies.asked_from_l3``) and those L3 served.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any

from kvtier.bench.phase import (
    ONE_SHOT,
    Flight,
    finished,
    one_shot_prompt,
    order,
    tree_cpu_seconds,
    user_turn,
)
from kvtier.bench.sglang_server import SglangServer
from kvtier.bench.sglang_strategies import asked_from_l3

TIMEOUT_S = 900


def generate(port: int, prompt: list[int], new_tokens: int, flight: Flight | None = None) -> Any:
    """Stream one greedy request; the last chunk's JSON, its ``output_ids`` complete. With
    ``flight``, each new token's arrival time and the answer so far are recorded there."""
    body = {
        "input_ids": prompt,
        "stream": True,
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
    }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
        answer = conn.getresponse()
        if answer.status != 200:
            raise RuntimeError(f"SGLang answered {answer.status}: {answer.read()[:500]!r}")
        return _read_stream(answer, flight)
    finally:
        conn.close()


def _read_stream(answer: http.client.HTTPResponse, flight: Flight | None) -> Any:
    last: Any = None
    tokens: list[int] = []
    for raw in answer:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        last = json.loads(line.removeprefix("data:"))
        ids = list(last.get("output_ids") or [])
        count = int(last["meta_info"].get("completion_tokens", len(ids)))
        tokens = ids if len(ids) == count else tokens + ids  # cumulative or incremental
        if flight is not None and count > len(flight.token_times):
            flight.token_times += [time.perf_counter()] * (count - len(flight.token_times))
    if last is None:
        raise RuntimeError("SGLang's stream ended without an answer")
    last["output_ids"] = tokens
    if flight is not None:
        flight.tokens = tokens
    return last


class _Phase:
    """The shared state of one phase's worker threads (see the module docstring)."""

    def __init__(self, port: int, phase: dict[str, Any]) -> None:
        self.port, self.phase = port, phase
        self.pending = order(phase)
        self.history: dict[int, list[int]] = {c: [] for c in range(phase["conversations"])}
        self.finals: dict[int, list[int]] = {}
        self.busy: set[int] = set()
        self.done: list[dict[str, Any]] = []
        self.errors: list[BaseException] = []
        self.lock = threading.Condition()

    def take(self) -> Flight | None:
        """The next request whose conversation is free (waits for one); ``None`` at the end."""
        with self.lock:
            while self.pending and not self.errors:
                pick = next(
                    (i for i, (c, _) in enumerate(self.pending) if c not in self.busy), None
                )
                if pick is not None:
                    return self._start(*self.pending.pop(pick))
                self.lock.wait()
            return None

    def _start(self, conversation: int, turn: int) -> Flight:
        if conversation == ONE_SHOT:
            key, prompt = f"one-shot/{turn}", one_shot_prompt(self.phase, turn)
        else:
            key = f"{conversation}/{turn}"
            prompt = self.history[conversation] + user_turn(self.phase, conversation, turn)
            self.finals[conversation] = prompt
        self.busy.add(conversation)
        return Flight(key, conversation, prompt, time.perf_counter())

    def serve(self) -> None:
        """One worker: serve requests until none is left (or another worker failed)."""
        try:
            while (flight := self.take()) is not None:
                last = generate(self.port, flight.prompt, self.phase["new_tokens"], flight)
                self._finish(flight, last["meta_info"].get("cached_tokens_details") or {})
        except BaseException as exc:
            with self.lock:
                self.errors.append(exc)
                self.lock.notify_all()

    def _finish(self, flight: Flight, cached: dict[str, Any]) -> None:
        with self.lock:
            self.busy.discard(flight.conversation)
            if flight.conversation != ONE_SHOT:
                self.history[flight.conversation] = flight.prompt + flight.tokens
            self.done.append({**finished(flight), "cached": _cached(cached)})
            self.lock.notify_all()


def _cached(details: dict[str, Any]) -> dict[str, int]:
    return {source: int(details.get(source) or 0) for source in ("device", "host", "storage")}


def run_phase(server: SglangServer, phase: dict[str, Any], concurrency: int) -> dict[str, Any]:
    """Serve one phase (see the module docstring); its report, ``cpu_seconds`` of the server's
    process tree."""
    assert server.process is not None
    state = _Phase(server.port, phase)
    count = max(1, concurrency)
    workers = [threading.Thread(target=state.serve, daemon=True) for _ in range(count)]
    start, cpu = time.perf_counter(), tree_cpu_seconds(server.process.pid)
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if state.errors:
        raise state.errors[0]
    return {
        "round": phase.get("round", 0),
        "conversations": phase["conversations"],
        "seconds": time.perf_counter() - start,
        "cpu_seconds": tree_cpu_seconds(server.process.pid) - cpu,
        "requests": state.done,
        "finals": [state.finals[c] for c in sorted(state.finals)],
    }


def replay(server: SglangServer, prompts: list[list[int]]) -> dict[str, Any]:
    """Each prompt once (see the module docstring): ``asked_tokens``, ``served_tokens`` and
    their ``hit_ratio`` (``None`` when L3 was asked for nothing)."""
    asked = served = 0
    for prompt in prompts:
        last = generate(server.port, prompt, 1)
        cached = _cached(last["meta_info"].get("cached_tokens_details") or {})
        asked += asked_from_l3(len(prompt), cached["device"], cached["host"])
        served += cached["storage"]
    ratio = round(served / asked, 4) if asked else None
    return {"prompts": len(prompts), "asked_tokens": asked, "served_tokens": served,
            "hit_ratio": ratio}  # fmt: skip
