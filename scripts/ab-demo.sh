#!/usr/bin/env bash
# The main job: set up, then a real A/B of a KV-cache change on the embedded trained model,
# SmolLM2-135M-Instruct: llama.cpp's llama-server with an f16 KV cache (the baseline) against q4_0, two
# boots per arm in ABBA order. Short probes (decode speed, and each arm's greedy answer: where the texts
# part) and the fidelity probe on the committed code text (teacher-forced logprobs at 1k and 4k tokens:
# |Δ logprob| against f16 with a 95% CI, beside the A/A across f16's own two boots; both texts:
# --kv-fidelity-texts=prose,code).
#
# Why llama.cpp here: on a CPU it serves the trained model ~7x faster than vLLM's CPU build (136 against
# ~20 decode tok/s on 2 cores), its q4_0 KV cache changes the model's greedy answers, and vLLM's CPU build
# changes this model's outputs with no KV type (float32 weights: only `auto` serves right; bf16 weights:
# float16 KV scores the same prompt logprobs as bf16 KV). docs/models.md has the measurements.
# KV_SECOND_ARM=q8_0 compares another cache type. A missing llama-server is built once (about 9 minutes on
# 2 cores) and cached in ~/.cache/pytest-kvcache/llama.cpp. Extra arguments go to pytest (e.g. --kv-runs=10).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv=$(cd "${KV_VENV:-.venv}" && pwd)
second=${KV_SECOND_ARM:-q4_0}
cd examples/quickstart
exec "$venv/bin/python" -m pytest --kv-engine=llamacpp --kv-arms="f16,$second" --kv-replicates=2 \
  -m "short or fidelity" --kv-fidelity-texts=code "$@"
