"""Runs one vLLM engine through a scenario and writes what happened as JSON (vLLM test venv).

``python runner.py SCENARIO.json`` where the scenario is::

    {"model": DIR, "engine_id": ID, "kv_pool_blocks": N, "max_model_len": N,
     "kv_transfer_config": {...} | null, "kv_events_port": PORT | null,
     "requests": [{"name": "A", "prompt_token_ids": [...], "max_tokens": 4,
                   "load_tiers": [{"medium": "STORAGE", "locality": "REMOTE"}]}, ...],
     "peer": {"identity_glob": GLOB, "port": PORT, "slots": N} | null, "output": PATH}

For each request in order: the generated token ids, the sampled tokens' logprobs, the seconds
it took, and how much every counter of ``llm.get_metrics()`` grew meanwhile (e.g.
``vllm:prompt_tokens_cached_by_source{source=disk}``). With ``kv_events_port`` the KV events the
engine publishes are received and decoded with vLLM's own ``KVEventBatch`` decoder. With
``load_tiers`` a request may load only from the tiers of that medium and locality (vLLM's
``kv_load_tiers``). With ``await_objects`` (``{"list_url": URL, "count": N}``) the request waits
until an S3 listing (``?list-type=2``) holds ``count`` chunk objects: until the cascades writing
to that store, which pin host slots, are done. With ``peer``, once the engine is up (its kvtier
tiers have written the cache identity under ``identity_glob``), a kvtier peer serving that
identity is started (``peer_server.py``) for the requests, and stopped after them.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

from kvtier.bench.vllm_runner import counters, grown, stop


class EventSink:
    """Receives vLLM's KV event batches on a SUB socket and decodes them with vLLM's structs."""

    def __init__(self, port: int) -> None:
        import zmq

        self._socket = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.connect(f"tcp://127.0.0.1:{port}")
        self.payloads: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._socket.poll(100):
                self.payloads.append(self._socket.recv_multipart()[-1])

    def summary(self) -> dict[str, Any]:
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        time.sleep(1.0)
        self._stop.set()
        self._thread.join()
        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        kinds: dict[str, int] = {}
        for payload in self.payloads:
            for event in decoder.decode(payload).events:
                key = f"{type(event).__name__}:{getattr(event, 'medium', None)}"
                kinds[key] = kinds.get(key, 0) + 1
        return {"batches": len(self.payloads), "events": kinds}


def engine(scenario: dict[str, Any]) -> Any:
    from vllm import LLM

    kwargs: dict[str, Any] = {}
    if scenario.get("kv_transfer_config"):
        kwargs["kv_transfer_config"] = scenario["kv_transfer_config"]
    if scenario.get("kv_events_port"):
        endpoint = f"tcp://*:{scenario['kv_events_port']}"
        kwargs["kv_events_config"] = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": endpoint,
        }
    block_bytes = scenario["block_bytes"]
    return LLM(
        model=scenario["model"],
        dtype="float32",
        max_model_len=scenario["max_model_len"],
        enforce_eager=True,
        enable_prefix_caching=True,
        disable_log_stats=False,
        kv_cache_memory_bytes=scenario["kv_pool_blocks"] * block_bytes,
        seed=0,
        **kwargs,
    )


CHUNK_OBJECT = re.compile(rb"<Key>[^<]*/[0-9a-f]{64}</Key>")
AWAIT_TIMEOUT_S = 120.0


def await_objects(list_url: str, count: int) -> None:
    """Polls an S3 listing until it names ``count`` chunk objects; raises after the timeout."""
    deadline = time.monotonic() + AWAIT_TIMEOUT_S
    while True:
        with urllib.request.urlopen(list_url, timeout=10) as response:
            found = len(CHUNK_OBJECT.findall(response.read()))
        if found >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{found} of {count} chunk objects at {list_url}")
        time.sleep(0.5)  # each listing costs moto CPU its puts need


def serve(llm: Any, request: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams

    if request.get("await_objects"):
        try:
            await_objects(**request["await_objects"])
        except RuntimeError as exc:  # say what the tiers did with the stores that never came
            tiers = {k: v for k, v in counters(llm).items() if "tier=" in k and v}
            raise RuntimeError(f"{exc}; tier counters: {tiers}") from exc
    transfer = dict(request.get("kv_transfer_params") or {})
    if request.get("load_tiers") is not None:
        transfer["kv_load_tiers"] = request["load_tiers"]
    extra = {"kv_transfer_params": transfer} if transfer else None
    params = SamplingParams(
        max_tokens=request["max_tokens"], temperature=0.0, logprobs=0, extra_args=extra
    )
    before = counters(llm)
    start = time.perf_counter()
    prompt = {"prompt_token_ids": request["prompt_token_ids"]}
    (result,) = llm.generate([prompt], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    out = result.outputs[0]
    logprobs = [step[tok].logprob for step, tok in zip(out.logprobs, out.token_ids, strict=True)]
    return {
        "name": request["name"],
        "token_ids": list(out.token_ids),
        "logprobs": logprobs,
        "seconds": seconds,
        "grown": grown(before, counters(llm)),
    }


def start_peer(peer: dict[str, Any]) -> subprocess.Popen[bytes]:
    """The kvtier peer process, serving the identity the engine's tiers wrote; waits for READY."""
    (identity_file,) = glob.glob(peer["identity_glob"])
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_server.py")
    command = [sys.executable, script, identity_file, str(peer["port"]), str(peer["slots"])]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"READY":
        proc.kill()
        raise RuntimeError("the kvtier peer process did not start")
    time.sleep(peer.get("settle_s", 2.0))  # the engine's peer tier reconnects in the background
    return proc


def main(path: str) -> None:
    with open(path) as file:
        scenario = json.load(file)
    started = time.perf_counter()
    sink = EventSink(scenario["kv_events_port"]) if scenario.get("kv_events_port") else None
    llm = engine(scenario)
    loaded = time.perf_counter() - started
    if sink is not None:
        time.sleep(0.5)  # the SUB socket joins before the first event is published
    peer = start_peer(scenario["peer"]) if scenario.get("peer") else None
    try:
        results = [serve(llm, request) for request in scenario["requests"]]
    finally:
        if peer is not None:
            peer.terminate()
            peer.wait(timeout=30)
    report = {
        "load_seconds": loaded,
        "requests": results,
        "final": counters(llm),
        "events": sink.summary() if sink is not None else None,
        "total_seconds": time.perf_counter() - started,
    }
    with open(scenario["output"], "w") as file:
        json.dump(report, file)
    stop(llm)


if __name__ == "__main__":
    main(sys.argv[1])
