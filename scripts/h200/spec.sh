#!/usr/bin/env bash
# On the GPU machine: speculative decoding in the A/B (issue 16) — fp8 vs int8_per_token_head with ngram
# speculation (3 tokens) on both arms, short + prefill (4k, 32k) + 10 agentic turns, one boot per arm, on
# the 8B-shaped dummy model. `spec.sh start` launches the plugin detached; `spec.sh collect` waits
# (≤ 9 min) and packs the run folder into $OUT/spec.tar.gz.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/scripts/h200/env.sh"
work=/tmp/kvspec
spec='{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
case "${1:?start|collect}" in
  start)
    start_plugin "$work" \
      --kv-arms=fp8,int8 -m "short or depth" \
      --kv-model="$repo/fixtures/qwen3-8b-shape" \
      --kv-engine-args="--load-format dummy --gpu-memory-utilization 0.5 --max-model-len 65536 --speculative-config '$spec'" \
      --kv-warmups=1 --kv-runs=3 \
      --kv-depths=4k,32k --kv-depth-warmups=1 --kv-depth-runs=2 \
      --kv-sessions=1 --kv-turns=10 --kv-startup-timeout=900 \
      --kv-fail="acceptance_length[agentic]: int8 >= fp8 * 0.95"
    ;;
  collect)
    bash "$repo/scripts/h200/collect.sh" "$work" spec.tar.gz
    ;;
esac
