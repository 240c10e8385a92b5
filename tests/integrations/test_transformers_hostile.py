"""``TieredModel`` under careless or hostile callers: bad arguments are refused before any work
(``InvalidArgumentError``, a ``ValueError``), valid ones of any integer type give a recompute's
tokens, and nothing runs the model past the positions it has.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from kvtier import CacheIdentity, ConfigError, KVTierError
from kvtier.device.transfer import TransferEngine
from kvtier.errors import ClosedError, InvalidArgumentError
from kvtier.integrations.transformers import (
    DeviceChunkCache,
    TieredModel,
    identity_for,
    layout_for,
)

from .conftest import BLOCK_SIZE, BLOCKS_PER_CHUNK, build_model, manager
from .test_transformers import NEW_TOKENS, assert_like_recompute, prompt

PROMPT = prompt(20, seed=40)


@pytest.fixture(scope="module")
def llama() -> Any:
    torch.set_num_threads(1)
    return build_model("llama")


@pytest.fixture(scope="module")
def llama_identity(llama: Any) -> CacheIdentity:
    return identity_for(llama, layout_for(llama, BLOCK_SIZE, BLOCKS_PER_CHUNK))


@pytest.fixture
def tiered(llama: Any, llama_identity: CacheIdentity) -> Iterator[TieredModel]:
    m = manager(llama_identity, 16, [])
    yield TieredModel(llama, llama_identity, m, device_cache=DeviceChunkCache(None))
    m.close()


@pytest.fixture
def forward_calls(llama: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the model's forward passes."""
    calls: list[int] = []
    original = llama.forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(llama, "forward", counted)
    return calls


def _generator() -> Iterator[int]:
    yield from PROMPT


BAD_PROMPTS = {
    "empty": [],
    "negative": [-1, *PROMPT],
    "vocab size": [*PROMPT, 512],
    "2**63": [2**63, *PROMPT],
    "2**62": [2**62, *PROMPT],
    "bool": [True, *PROMPT],
    "None in it": [*PROMPT, None],
    "float": [1.5, *PROMPT],
    "integral float": [1.0, *PROMPT],
    "str": "hello world, hello world",
    "bytes": b"hello world, hello world",
    "set": set(PROMPT),
    "generator": _generator(),
    "None": None,
    "int": 5,
    "float array": np.array(PROMPT, dtype=np.float64),
    "bool array": np.ones(20, dtype=bool),
    "2-D array": np.array([PROMPT]),
    "float tensor": torch.tensor(PROMPT, dtype=torch.float32),
    "2-D tensor": torch.tensor([PROMPT]),
    "0-D tensor": torch.tensor(5),
    "negative tensor": torch.tensor([-3, *PROMPT]),
    "past max positions": prompt(257, seed=41),
}


@pytest.mark.parametrize("token_ids", BAD_PROMPTS.values(), ids=BAD_PROMPTS.keys())
def test_bad_token_ids_are_refused_before_any_work(
    tiered: TieredModel,
    forward_calls: list[int],
    token_ids: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(InvalidArgumentError, match="token_ids"):
        tiered.generate(token_ids, NEW_TOKENS)
    assert forward_calls == []
    assert len(tiered.device_cache) == 0
    prefetched: list[Any] = []
    monkeypatch.setattr(tiered.manager, "prefetch", prefetched.append)
    tiered.prefetch(token_ids)  # a hint: a prompt generate refuses is not prefetched, no error
    assert prefetched == []


GOOD_PROMPTS = {
    "tuple": tuple(PROMPT),
    "numpy ints": [np.int64(t) for t in PROMPT],
    "int32 array": np.array(PROMPT, dtype=np.int32),
    "uint16 array": np.array(PROMPT, dtype=np.uint16),
    "long tensor": torch.tensor(PROMPT),
    "int32 tensor": torch.tensor(PROMPT, dtype=torch.int32),
}


@pytest.mark.parametrize("token_ids", GOOD_PROMPTS.values(), ids=GOOD_PROMPTS.keys())
def test_token_ids_of_any_integer_type_give_a_recompute(
    llama: Any, tiered: TieredModel, token_ids: Any
) -> None:
    tiered.generate(PROMPT, NEW_TOKENS)
    tiered.prefetch(token_ids)
    result = tiered.generate(token_ids, NEW_TOKENS)
    assert result.cached_tokens == 16
    assert_like_recompute(llama, PROMPT, result)


def test_prompts_of_one_token_and_of_max_positions_give_a_recompute(
    llama: Any, tiered: TieredModel
) -> None:
    """253 + 3 decoded tokens fill the 256 positions; a prompt of 256 gets its one token."""
    for tokens in ([7], prompt(256 - NEW_TOKENS + 1, seed=42)):
        assert_like_recompute(llama, tokens, tiered.generate(tokens, NEW_TOKENS))
    tokens = prompt(256, seed=42)
    result = tiered.generate(tokens, NEW_TOKENS)
    with torch.inference_mode():
        full = llama(input_ids=torch.tensor([tokens])).logits[0, result.cached_tokens :]
    assert (result.logits - full).abs().max().item() <= 1e-4
    assert result.tokens == [int(full[-1].argmax())]


@pytest.mark.parametrize("count", [0, -1, 2.5, 2.0, True, "3", None, math.nan, math.inf])
def test_bad_max_new_tokens_is_refused(
    tiered: TieredModel, forward_calls: list[int], count: Any
) -> None:
    with pytest.raises(InvalidArgumentError, match="max_new_tokens"):
        tiered.generate(PROMPT, count)
    assert forward_calls == []


def test_decoding_stops_where_the_model_runs_out_of_positions(
    llama: Any, tiered: TieredModel
) -> None:
    """A huge ``max_new_tokens`` ends when the sequence fills ``max_position_embeddings`` (256)
    instead of running on (for ever, or into an IndexError for learned positions)."""
    tokens = prompt(250, seed=43)
    result = tiered.generate(tokens, 50)
    assert len(result.tokens) == 256 - 250 + 1  # the last one needs no position of its own
    assert tiered.generate(tokens, 2**62).tokens == result.tokens
    with torch.inference_mode():
        expected = llama.generate(torch.tensor([tokens]), max_new_tokens=7, do_sample=False)
    assert result.tokens == expected[0, 250:].tolist()


def test_learned_positions_are_never_indexed_past_their_table() -> None:
    """GPT-2 embeds positions from a table of ``n_positions``: a prompt past it is refused, and
    decoding stops where it ends (both were an IndexError from inside torch)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=32)
    model = GPT2LMHeadModel(config).eval()
    tiered = TieredModel(model, identity_for(model, layout_for(model, 4, 2)))
    assert len(tiered.generate(list(range(30)), 10).tokens) == 3
    with pytest.raises(InvalidArgumentError, match="token_ids"):
        tiered.generate(list(range(33)), 1)


@pytest.mark.parametrize("stop", [5, None, "abc", b"ab", [1.5], [True], [None]])
def test_bad_stop_tokens_are_refused(
    tiered: TieredModel, forward_calls: list[int], stop: Any
) -> None:
    with pytest.raises(InvalidArgumentError, match="stop_tokens"):
        tiered.generate(PROMPT, NEW_TOKENS, stop)
    assert forward_calls == []


def test_stop_tokens_from_an_iterator_stop_decoding(tiered: TieredModel) -> None:
    """An iterator is read once: checking a token against it must not use it up."""
    free = tiered.generate(PROMPT, NEW_TOKENS).tokens
    stopped = tiered.generate(PROMPT, NEW_TOKENS, iter([np.int64(free[1])])).tokens
    assert stopped == free[: free.index(free[1]) + 1]


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, "5", None, True])
def test_bad_retry_timeout_is_refused(
    llama: Any, llama_identity: CacheIdentity, value: Any
) -> None:
    with pytest.raises(InvalidArgumentError, match="retry_timeout_s"):
        TieredModel(llama, llama_identity, retry_timeout_s=value)


@pytest.mark.parametrize("salt", [5, 0, [1], 1.5, True])
def test_a_salt_that_is_not_text_or_bytes_is_refused(
    llama: Any, llama_identity: CacheIdentity, salt: Any
) -> None:
    """``bytes(5)`` is five zero bytes and ``0`` is no salt: such salts would share keys."""
    with pytest.raises(InvalidArgumentError, match="salt"):
        TieredModel(llama, llama_identity, salt=salt)


@pytest.mark.parametrize("capacity", [-1, math.nan, math.inf, 2.5, "3", True])
def test_bad_device_cache_capacity_is_refused(capacity: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="capacity"):
        DeviceChunkCache(capacity)


def test_device_cache_capacities_that_are_valid(llama: Any, llama_identity: CacheIdentity) -> None:
    for capacity, cached in ((0, 0), (np.int64(1), 8), (2**100, 16)):
        tiered = TieredModel(llama, llama_identity, device_cache=DeviceChunkCache(capacity))
        tiered.generate(PROMPT, NEW_TOKENS)
        result = tiered.generate([*PROMPT, 3], NEW_TOKENS)
        assert result.cached_tokens == cached
        assert_like_recompute(llama, [*PROMPT, 3], result)


def test_generate_after_close_is_refused_before_the_model_runs(
    llama: Any, llama_identity: CacheIdentity, forward_calls: list[int]
) -> None:
    m = manager(llama_identity, 16, [])
    tiered = TieredModel(llama, llama_identity, m)
    m.close()
    forward_calls.clear()  # building probed the model's cache
    for tokens in ([7], PROMPT):
        with pytest.raises(ClosedError):
            tiered.generate(tokens, NEW_TOKENS)
    assert forward_calls == []


def test_a_model_whose_cache_the_identity_does_not_describe_is_refused(
    llama_identity: CacheIdentity,
) -> None:
    """Another head count: the chunks would not fit; refused when built, not after a forward."""
    from transformers import LlamaConfig, LlamaForCausalLM

    other = LlamaForCausalLM(
        LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4)
    ).eval()  # fmt: skip
    with pytest.raises(ConfigError, match="layout"):
        TieredModel(other, llama_identity)


class StillCopying:
    """A stream event whose copy has not finished until ``landed`` is set (as a busy CUDA
    stream's would be)."""

    landed = False

    def query(self) -> bool:
        return self.landed

    def synchronize(self) -> None:
        self.landed = True


def loads_run_late(monkeypatch: pytest.MonkeyPatch, stop: type[BaseException]) -> StillCopying:
    """Until the returned event is set ``landed``, a load's wait raises ``stop`` with its copy
    still running."""
    real_wait, copying = TransferEngine.wait, StillCopying()

    def wait(engine: TransferEngine, job_id: int, timeout: float | None = None) -> Any:
        job = engine._jobs[job_id]
        if job.result.op == "load" and not copying.landed and job.event is None:
            job.event = copying
            raise stop(f"transfer job {job_id} did not finish in {timeout} s")
        return real_wait(engine, job_id, timeout)

    monkeypatch.setattr(TransferEngine, "wait", wait)
    return copying


@pytest.mark.parametrize("stop", [KVTierError, KeyboardInterrupt])
def test_a_load_copy_past_its_wait_keeps_its_slots_held_until_it_lands(
    model: Any,
    identity: CacheIdentity,
    make_manager: Any,
    monkeypatch: pytest.MonkeyPatch,
    stop: type[BaseException],
) -> None:
    """A copy out of host that outlives its wait is not given up: its slots stay held, so that
    nothing overwrites them mid-copy, until a later call sees it land. A wait that timed out
    (``KVTierError``) recomputes the request; one interrupted (Ctrl-C, a CUDA error) raises,
    and the copy is still kept. Either way the requests after it go on (they used to fail on
    the stray job, and an interrupted one held its slots for ever)."""
    m = make_manager(host_slots=12)
    tiered = TieredModel(model, identity, m)
    first = prompt(44, seed=3)
    tiered.generate(first, NEW_TOKENS)
    tiered.flush()
    copying = loads_run_late(monkeypatch, stop)
    follow_up = first + prompt(3, seed=5)
    if stop is KVTierError:
        result = tiered.generate(follow_up, NEW_TOKENS)
        assert result.sources["recomputed"] == len(follow_up)
        assert_like_recompute(model, follow_up, result)
    else:
        with pytest.raises(stop):
            tiered.generate(follow_up, NEW_TOKENS)
    assert m.stats()["host"]["held_slots"] == 5  # the late copy's chunks, still being read
    copying.landed = True
    again = tiered.generate(follow_up, NEW_TOKENS)
    assert again.sources["host"] == 40
    assert_like_recompute(model, follow_up, again)
    tiered.flush()
    assert m.stats()["host"]["held_slots"] == 0


def test_a_late_load_keeps_the_device_cache_slots_it_writes_into_until_it_lands(
    model: Any, identity: CacheIdentity, make_manager: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load lands in slots of the device cache; while its copy is in flight, chunks stored by
    later requests go elsewhere (else the copy would land over them)."""
    m = make_manager(host_slots=24)
    device = DeviceChunkCache(capacity=6)
    tiered = TieredModel(model, identity, m, device_cache=device)
    first = prompt(44, seed=3)
    tiered.generate(first, NEW_TOKENS)
    tiered.flush()
    device.put([b"other format"], [torch.zeros(1)])  # empties the device cache
    copying = loads_run_late(monkeypatch, KVTierError)
    real_claim, in_flight = DeviceChunkCache.claim, set()

    def claim(cache: DeviceChunkCache, *args: Any) -> list[torch.Tensor]:
        claimed = real_claim(cache, *args)
        in_flight.update(chunk.data_ptr() for chunk in claimed)  # no reference kept
        return claimed

    monkeypatch.setattr(DeviceChunkCache, "claim", claim)
    follow_up = first + prompt(3, seed=5)
    assert tiered.generate(follow_up, NEW_TOKENS).sources["recomputed"] == len(follow_up)
    monkeypatch.setattr(DeviceChunkCache, "claim", real_claim)
    assert len(in_flight) == 5
    for seed in (11, 12):
        tiered.generate(prompt(40, seed=seed), NEW_TOKENS)
    assert len(device) >= 1
    assert not in_flight & {device._slots[slot].data_ptr() for slot in device._chunks.values()}
    copying.landed = True
    again = tiered.generate(follow_up, NEW_TOKENS)
    assert again.sources["host"] == 40
    assert_like_recompute(model, follow_up, again)


def interrupt_hand_out(monkeypatch: pytest.MonkeyPatch, op: str) -> list[int]:
    """Ctrl-C just after the engine hands out the first finished ``op`` copy (once it has left
    the engine's jobs); the returned list gets that job's id."""
    real_take, interrupted = TransferEngine._take, []

    def take(engine: TransferEngine, job_id: int) -> Any:
        result = real_take(engine, job_id)
        if result.op == op and not interrupted:
            interrupted.append(job_id)
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(TransferEngine, "_take", take)
    return interrupted


def test_a_load_interrupted_after_its_copy_landed_releases_its_slots_at_once(
    model: Any, identity: CacheIdentity, make_manager: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C a bytecode after the engine handed the finished copy out: nothing will report
    the job again, so keeping it as a late load held its slots for ever and ``flush`` failed
    on it (KeyError). The copy is done: the slots go at once."""
    m = make_manager(host_slots=12)
    tiered = TieredModel(model, identity, m)
    first = prompt(44, seed=3)
    tiered.generate(first, NEW_TOKENS)
    tiered.flush()
    interrupted = interrupt_hand_out(monkeypatch, "load")
    follow_up = first + prompt(3, seed=5)
    with pytest.raises(KeyboardInterrupt):
        tiered.generate(follow_up, NEW_TOKENS)
    assert interrupted and m.stats()["host"]["held_slots"] == 0
    again = tiered.generate(follow_up, NEW_TOKENS)
    assert again.sources["host"] == 40
    assert_like_recompute(model, follow_up, again)
    tiered.flush()
    assert m.stats()["host"]["held_slots"] == 0


@pytest.mark.parametrize("where", ["flush", "generate"])
def test_a_copy_handed_out_while_interrupted_is_finished_by_the_next_call(
    model: Any,
    identity: CacheIdentity,
    make_manager: Any,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """Ctrl-C right after the engine handed out a finished store (in ``flush``'s wait, or in
    the poll after ``generate``'s store): the job stayed listed, its slots held for ever, and
    every later ``flush`` failed on it (KeyError). The next call finishes it."""
    m = make_manager(host_slots=12)
    tiered = TieredModel(model, identity, m)
    first = prompt(44, seed=3)
    real_submit = TransferEngine.submit_store

    def submit_store(engine: TransferEngine, *args: Any) -> int:
        job_id = real_submit(engine, *args)
        engine._jobs[job_id].event = StillCopying()  # lands when flush waits for it
        return job_id

    if where == "flush":
        monkeypatch.setattr(TransferEngine, "submit_store", submit_store)
    interrupted = interrupt_hand_out(monkeypatch, "store")
    with pytest.raises(KeyboardInterrupt):
        tiered.generate(first, NEW_TOKENS)
        tiered.flush()
    assert interrupted and m.stats()["host"]["held_slots"] > 0
    tiered.flush()
    assert m.stats()["host"]["held_slots"] == 0
    again = tiered.generate(first, NEW_TOKENS)
    assert again.sources["host"] == 40
    tiered.flush()
    assert m.stats()["host"]["held_slots"] == 0
