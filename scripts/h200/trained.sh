#!/usr/bin/env bash
# On the GPU machine (issue 37, run 1): the seed's question on a trained model — auto (bf16) vs fp8 vs
# int8_per_token_head on SmolLM2-135M-Instruct (converted by unbundle.sh), 3 boots per arm (9 boots, blocks in
# the plan's counterbalanced order), ngram speculation on every arm (acceptance on real text, no extra boots),
# and, per boot: short probes (2 shapes, 1 warm-up + 3 requests of 512 tokens), fidelity at 1k/4k/7k (a 7K text
# and its scored window fit the 8K context), output agreement (automatic after the short probes), and one agentic session fitted to the
# context. Energy per token and the cost line come with every run. Gates at default settings; the fp8 fidelity
# gate fails on purpose (fp8 moved this model's logprobs by ~0.14 nats/token, FACTS.md): exit code 1.
#
# `trained.sh start` launches the run detached (setsid); `trained.sh collect` waits (≤ 9 min a call, repeat
# until "finished") and packs the run folder into $OUT/trained.tar.gz with pytest.log.
#
# Planned device time (docs: scripts/h200/README.md, step 10): staging + unbundle ~4 min, boots ~261 s first
# (torch.compile) then ~60–100 s each (8 more), measuring ~35 s a boot: ~18 min for the run, ~22 in all.
#
# From other branches (merge them first):
#   i33 — pytest_kvcache.engines.trained_model (unbundle.sh's converter); probes that know the model's 8K
#         context: the agentic fixture scaled to fit it, requests that cannot fit left out and named;
#   i32 — the gates' evidence and `boots_to_decide` on open gates (the first screen shows it when present).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/scripts/h200/env.sh"
work=/tmp/kvtrained
model=/tmp/models/smollm2-135m
spec='{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
# --dtype bfloat16: auto KV is bf16 (the converted folder holds float32); --max-num-seqs 8: every probe here
# streams one request at a time, and vLLM then captures CUDA graphs for batches ≤ 16 only (faster boots)
engine="--dtype bfloat16 --gpu-memory-utilization 0.3 --max-num-seqs 8 --speculative-config '$spec'"
case "${1:?start|collect}" in
  start)
    [ -f "$model/config.json" ] || { echo "no model at $model: run scripts/h200/unbundle.sh first" >&2; exit 4; }
    start_recorded "$work" \
      --kv-arms=auto,fp8,int8 --kv-replicates=3 -m "short or fidelity or agentic" \
      --kv-model="$model" --kv-engine-args="$engine" \
      --kv-warmups=1 --kv-runs=3 --kv-max-tokens=512 \
      --kv-fidelity-depths=1k,4k,7k \
      --kv-sessions=1 \
      --kv-progress=lines --kv-startup-timeout=900 \
      "--kv-fail=decode_tps[short]: int8 >= fp8 * 0.5" \
      "--kv-fail=energy_per_token[short]: int8 <= fp8 * 1.5" \
      "--kv-fail=logprob_drift[fidelity@7k]: int8 <= 0.1" \
      "--kv-fail=logprob_drift[fidelity@7k]: fp8 <= 0.1"
    ;;
  collect)
    collect_recorded "$work" trained.tar.gz
    ;;
esac
