#!/usr/bin/env bash
# On the GPU machine (issues 36 and 37, run 2): capacity under an SLO — how many concurrent long-context sessions
# each arm sustains — auto (bf16) vs fp8 KV on the 8B-shaped Qwen3 with dummy weights (fixtures/qwen3-8b-shape),
# one KV budget for both arms (--kv-cache-bytes=8GiB: 58,254 tokens at bf16's 147,456 bytes a token, 116,508 at
# fp8's 73,728; KV_BYTES=12GiB for 87,381 and 174,762) so the capacity ratio comes from the KV dtype, sessions of
# 16K and 32K tokens, the GPU default SLO (ttft_p95<=2s,itl_p95<=60ms) and think time (2 s), trials of 10 s (the
# default 30 s would take ~3× the device time), the search from 1 session, at most 12 (MAX_SESSIONS), eager mode
# (EAGER= to compile: a first boot then takes ~273 s), both knees (the SLO's and the KV-residency one, issue 42)
# with their own gates; one boot per arm (--kv-max-replicates=1: an open gate
# would otherwise add boots past the hold, and says how many instead). The short probes run too, so energy
# per token has decode windows of seconds on this model. ARMS=auto,fp8,int8 adds int8_per_token_head when the
# time allows (~+5 min: one more boot and its searches).
#
# `capacity.sh start` launches it detached (setsid); `capacity.sh collect` waits (≤ 9 min a call, repeat until
# "finished") and packs the run folder into $OUT/capacity.tar.gz with pytest.log.
#
# Planned device time (scripts/h200/README.md, step 11): staging + unbundle ~4 min, boots ~273 s first
# (torch.compile) then ~70–100 s, capacity searches ~1.5–2 min per arm and depth, short probes ~30 s a boot:
# ~14 min for the run, ~18 in all.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/scripts/h200/env.sh"
work=/tmp/kvcapacity
arms=${ARMS:-auto,fp8}
case "${1:?start|collect}" in
  start)
    depths=${DEPTHS:-16k,32k}
    gates=()
    for d in ${depths//,/ }; do
      gates+=("--kv-fail=capacity[capacity@$d]: fp8 >= auto * 1.5" "--kv-fail=kv_residency[capacity@$d]: fp8 >= auto * 1.5")
    done
    start_recorded "$work" \
      --kv-arms="$arms" -m "short or capacity" \
      --kv-model="$repo/fixtures/qwen3-8b-shape" \
      --kv-engine-args="--load-format dummy --max-model-len 40960 ${EAGER---enforce-eager}" \
      --kv-cache-bytes="${KV_BYTES:-8GiB}" \
      --kv-capacity-depths="$depths" --kv-capacity-window=10 \
      --kv-capacity-start=1 --kv-capacity-max-sessions="${MAX_SESSIONS:-12}" \
      --kv-warmups=1 --kv-runs=3 --kv-max-tokens=512 \
      --kv-progress=lines --kv-startup-timeout=900 --kv-max-replicates=1 \
      "${gates[@]}" \
      "--kv-fail=energy_per_token[short]: fp8 <= auto * 1.2"
    ;;
  collect)
    collect_recorded "$work" capacity.tar.gz
    ;;
esac
