#!/usr/bin/env bash
# The main job: set up, then a real A/B of a KV-cache change on the embedded trained model,
# SmolLM2-135M-Instruct: llama.cpp's llama-server with an f16 KV cache (the baseline) against q4_0, two
# boots per arm in ABBA order. Short probes (decode speed, and each arm's greedy answer: where the texts
# part) and the fidelity probe on the four committed texts (teacher-forced logprobs at 500 and 1k tokens,
# the last 64 positions before each: |Δ logprob| against f16 with a 95% CI over the texts, beside the A/A
# across f16's own two boots; 4 texts x 1k tokens a boot: the prefill of one text to 4k, as before).
#
# Why llama.cpp here: it runs alike on every x86 CPU, serves the trained model several times faster than
# vLLM's CPU build (136 against ~20 decode tok/s on 2 AVX2 cores), and its q4_0 KV cache changes the
# model's greedy answers. vLLM's CPU build changes this model's outputs only with fp8 KV, which needs
# AVX-512/AMX (`pytest --kv-arms=auto,fp8 -m "short or fidelity" --kv-replicates=2` runs it there); its
# float16 KV scores what bf16 KV does. docs/models.md has the measurements.
# KV_SECOND_ARM=q8_0 compares another cache type. A missing llama-server is built once (about 9 minutes on
# 2 cores) and cached in ~/.cache/pytest-kvcache/llama.cpp. Extra arguments go to pytest (e.g. --kv-runs=10).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv=$(cd "${KV_VENV:-.venv}" && pwd)
second=${KV_SECOND_ARM:-q4_0}
cd examples/quickstart
exec "$venv/bin/python" -m pytest --kv-engine=llamacpp --kv-arms="f16,$second" --kv-replicates=2 \
  -m "short or fidelity" --kv-fidelity-depths=500,1k --kv-fidelity-window=64 "$@"
