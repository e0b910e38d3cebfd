#!/usr/bin/env bash
# On the GPU machine: MTP speculative decoding through the plugin (issue 16) — the Qwen3-Next-shaped hybrid
# with one MTP layer (fixtures/qwen3-next-mtp, dummy weights), 3 speculative tokens, one arm, short code
# shape + prefill at 4k and 16k. `--gdn-prefill-backend triton` skips FlashInfer's GDN JIT (ready in
# ~205 s instead of ~424 s). `mtp.sh start` launches it detached; `mtp.sh collect` packs $OUT/mtp.tar.gz.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/scripts/h200/env.sh"
work=/tmp/kvmtp
spec='{"method":"mtp","num_speculative_tokens":3}'
case "${1:?start|collect}" in
  start)
    mkdir -p "$work/model"  # the config beside the 8B shape's tokenizer (the vocabulary sizes match)
    cp "$repo/fixtures/qwen3-next-mtp/config.json" "$repo"/fixtures/qwen3-8b-shape/tokenizer*.json "$work/model/"
    start_plugin "$work" \
      --kv-arms=auto -m "short or prefill" -k "code or prefill" \
      --kv-model="$work/model" \
      --kv-engine-args="--load-format dummy --enforce-eager --gpu-memory-utilization 0.5 --max-model-len 32768 --gdn-prefill-backend triton --speculative-config '$spec'" \
      --kv-warmups=1 --kv-runs=3 --kv-depths=4k,16k --kv-depth-warmups=1 --kv-depth-runs=2 \
      --kv-startup-timeout=560 --kv-no-self-check
    ;;
  collect)
    bash "$repo/scripts/h200/collect.sh" "$work" mtp.tar.gz
    ;;
esac
