#!/usr/bin/env bash
# On the GPU machine (issue 37, run 2): capacity under an SLO — how many concurrent long-context sessions each
# arm sustains — fp8 vs auto (bf16) on the 8B-shaped dummy model (fixtures/qwen3-8b-shape), with one KV budget
# for both arms (8 GiB: ~58K tokens of bf16 KV, ~116K of fp8) so the capacity ratio comes from the KV dtype, at
# the probe's two GPU depths (16k, 32k), one boot per arm. The short probes run too, so energy per token has
# decode windows of seconds on this model. ARMS=auto,fp8,int8 adds int8_per_token_head when the time allows
# (~+5 min: one more boot and its searches).
#
# `capacity.sh start` launches it detached (setsid); `capacity.sh collect` waits (≤ 9 min a call, repeat until
# "finished") and packs the run folder into $OUT/capacity.tar.gz with pytest.log.
#
# Planned device time (scripts/h200/README.md, step 11): staging + unbundle ~4 min (vLLM and the extras; the
# SmolLM2 part may be left out), boots ~273 s first (torch.compile) then ~70–100 s, capacity searches
# ~1.5–2 min per arm and depth (15 s windows), short probes ~30 s a boot: ~14 min for the run, ~18 in all.
#
# From other branches (merge them first):
#   i36 — the capacity probe (`-m capacity`) and its options: --kv-cache-bytes (every vLLM arm's
#         --kv-cache-memory-bytes), --kv-slo, --kv-capacity-depths, --kv-capacity-think,
#         --kv-capacity-window, --kv-capacity-max-sessions; the `capacity` metric and its gates
#         (names as of i36's commit a9ec799: check them against docs/configuration.md after the merge).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/scripts/h200/env.sh"
work=/tmp/kvcapacity
arms=${ARMS:-auto,fp8}
engine="--load-format dummy --gpu-memory-utilization 0.5 --max-model-len 40960"
case "${1:?start|collect}" in
  start)
    start_recorded "$work" \
      --kv-arms="$arms" -m "short or capacity" \
      --kv-model="$repo/fixtures/qwen3-8b-shape" --kv-engine-args="$engine" \
      --kv-cache-bytes=8GiB \
      --kv-slo="ttft_p95<=2s,itl_p95<=60ms" \
      --kv-capacity-depths=16k,32k --kv-capacity-think=2 --kv-capacity-window=15 --kv-capacity-max-sessions=32 \
      --kv-warmups=1 --kv-runs=3 --kv-max-tokens=512 \
      --kv-progress=lines --kv-startup-timeout=900 \
      "--kv-fail=capacity[capacity@16k]: fp8 >= auto * 1.5" \
      "--kv-fail=capacity[capacity@32k]: fp8 >= auto * 1.5" \
      "--kv-fail=energy_per_token[short]: fp8 <= auto * 1.2"
    ;;
  collect)
    collect_recorded "$work" capacity.tar.gz
    ;;
esac
