#!/usr/bin/env bash
# On the GPU machine: fidelity at depth (issue 17) — auto vs fp8 vs int8_per_token_head, plus an A/A arm,
# on real vLLM 0.25.1 with the embedded tiny model given seeded random weights
# (fixtures/make_random_weights.py; dummy weights give flat logits that no KV dtype can move). Short and
# prefill probes too, so the report's sentence puts speed beside fidelity. `fidelity.sh start` launches
# the plugin detached; `fidelity.sh collect` waits (≤ 9 min, repeatable) and packs the run folder into
# $OUT/fidelity.tar.gz.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/scripts/h200/env.sh"
work=/tmp/kvfid
case "${1:?start|collect}" in
  start)
    mkdir -p "$work"
    python3 "$repo/fixtures/make_random_weights.py" --out "$work/tiny-random" --std 0.05 --seed 0
    start_plugin "$work" \
      --kv-arms=auto,auto,fp8,int8 -m "short or prefill or fidelity" \
      --kv-model="$work/tiny-random" \
      --kv-engine-args="--gpu-memory-utilization 0.3 --enforce-eager" \
      --kv-warmups=2 --kv-runs=5 --kv-max-tokens=256 \
      --kv-depths=1k,8k,32k --kv-depth-runs=3 \
      --kv-fidelity-depths=1k,4k,16k,32k,64k \
      --kv-progress=lines --kv-startup-timeout=600 \
      "--kv-fail=logprob_drift[fidelity]: auto.2 <= 0.001"
    ;;
  collect)
    bash "$repo/scripts/h200/collect.sh" "$work" fidelity.tar.gz
    ;;
esac
