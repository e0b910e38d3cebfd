#!/usr/bin/env bash
# On the GPU machine: output agreement of auto vs fp8 (and auto vs auto) on real vLLM 0.25.1 with the
# embedded tiny model given seeded random weights (fixtures/make_random_weights.py): dummy weights give
# flat logits, in which no KV dtype can change a token. `agreement.sh start` launches the plugin
# detached; `agreement.sh collect` waits (≤ 9 min) and packs the run folder into $OUT/agreement.tar.gz.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/scripts/h200/env.sh"
work=/tmp/kvagree
case "${1:?start|collect}" in
  start)
    mkdir -p "$work"
    python3 "$repo/fixtures/make_random_weights.py" --out "$work/tiny-random" --std 0.05 --seed 0
    start_plugin "$work" \
      --kv-arms=auto,fp8,auto -m short \
      --kv-model="$work/tiny-random" \
      --kv-engine-args="--gpu-memory-utilization 0.3 --enforce-eager" \
      --kv-warmups=2 --kv-runs=5 --kv-max-tokens=256 --kv-startup-timeout=600
    ;;
  collect)
    bash "$repo/scripts/h200/collect.sh" "$work" agreement.tar.gz
    ;;
esac
