#!/usr/bin/env bash
# On the GPU machine: `run.sh start` launches the plugin detached; `run.sh collect` waits (≤ 9 min) and
# packs the run folder into $OUT/run.tar.gz.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/scripts/h200/env.sh"
work=/tmp/kvproject
case "${1:?start|collect}" in
  start)
    start_plugin "$work" \
      --kv-arms=fp8,int8 -m "short or depth" \
      --kv-model="$repo/fixtures/qwen3-8b-shape" \
      --kv-engine-args="--load-format dummy --gpu-memory-utilization 0.5 --max-model-len 131072" \
      --kv-depths=10k,60k --kv-depth-warmups=1 --kv-depth-runs=2 \
      --kv-sessions=2 --kv-startup-timeout=900 \
      --kv-fail="decode_tps[short]: int8 >= fp8 * 1.0" --kv-fail="prefill_tps[prefill]: >= -50%"
    ;;
  collect)
    bash "$repo/scripts/h200/collect.sh" "$work" run.tar.gz
    ;;
esac
