#!/usr/bin/env bash
# On the GPU machine: capacity under an SLO (issue 36) — auto (bf16) vs fp8 KV on the 8B-shaped Qwen3 with dummy
# weights (fixtures/qwen3-8b-shape), one KV budget for both arms (--kv-cache-bytes=12GiB: 87,381 tokens at
# bf16's 147,456 bytes a token, 174,762 at fp8's 73,728), sessions of 16K and 32K tokens, the GPU default SLO
# (ttft_p95<=2s,itl_p95<=60ms) and think time (2 s). Trials of 10 s (the default 30 s would take ~3× the device
# time); the search from 2 sessions, at most 32. `capacity.sh start` launches the plugin detached;
# `capacity.sh collect` waits (≤ 9 min, repeatable) and packs the run folder into $OUT/capacity.tar.gz.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/scripts/h200/env.sh"
work=/tmp/kvcapacity
case "${1:?start|collect}" in
  start)
    start_plugin "$work" \
      --kv-arms=auto,fp8 -m capacity \
      --kv-model="$repo/fixtures/qwen3-8b-shape" \
      --kv-engine-args="--load-format dummy --max-model-len 40960" \
      --kv-cache-bytes=12GiB \
      --kv-capacity-depths=16k,32k --kv-capacity-window=10 \
      --kv-capacity-start=2 --kv-capacity-max-sessions=32 \
      --kv-progress=lines --kv-startup-timeout=900 \
      "--kv-fail=capacity[capacity@16k]: fp8 >= auto * 1.5" \
      "--kv-fail=capacity[capacity@32k]: fp8 >= auto * 1.5"
    ;;
  collect)
    bash "$repo/scripts/h200/collect.sh" "$work" capacity.tar.gz
    ;;
esac
