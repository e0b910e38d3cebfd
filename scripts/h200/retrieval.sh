#!/usr/bin/env bash
# On the GPU machine (issue 46, items 3 and 4), after unbundle.sh converted SmolLM2-135M-Instruct: two runs back
# to back in one detached driver.
#
#   retrieval  auto (bf16) vs fp8 vs int8_per_token_head, one boot an arm, the retrieval probe at its defaults for
#              this 8K model (depths 1k, 4k and the model's limit 8,168; positions 10/50/90%; 90 needles a cell;
#              the recall form), single needle and the 4-key variant on the same boot (--kv-retrieval-keys=1,4),
#              gates at 8,168 tokens: each arm within 10 points of auto;
#   aa         auto against itself, ${AA_BOOTS:-4} boots a side (ABBA order), the short probes (1 warm-up + 3 requests
#              of 512 tokens a shape) and fresh prefill at 2k and 7k, no gates (the acceptance suite judges the
#              documented ones; a gate here would add rounds): data for the A/A acceptance suite.
#
# Both serve in eager mode (--enforce-eager: boots of ~40 s instead of a torch.compile and CUDA-graph capture);
# bf16 weights (--dtype bfloat16: auto KV is bf16).
#
# `retrieval.sh start` launches both detached (setsid), `retrieval.sh start aa` the A/A alone; `retrieval.sh collect retrieval` and then
# `retrieval.sh collect aa` wait (≤ 9 min a call; repeat until "finished") and pack each run folder into
# $OUT/{retrieval,aa}.tar.gz with its pytest log. `touch /tmp/kvretrieval/no-aa` while the first runs skips the A/A.
#
# Planned device time (scripts/h200/README.md, step 13): staging + unbundle ~5 min, retrieval 3 boots + 1,620
# needles an arm ~10 min, the A/A 6 boots ~7 min.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/scripts/h200/env.sh"
model=/tmp/models/smollm2-135m
engine="--dtype bfloat16 --gpu-memory-utilization 0.3 --max-num-seqs 8 --enforce-eager"
common=(--kv-model="$model" --kv-engine-args="$engine" --kv-progress=lines --kv-startup-timeout=600)
case "${1:?start [aa]|collect retrieval|aa}" in
  start)
    [ -f "$model/config.json" ] || { echo "no model at $model: run scripts/h200/unbundle.sh first" >&2; exit 4; }
    write_recorded /tmp/kvretrieval \
      --kv-arms=auto,fp8,int8 -m retrieval "${common[@]}" --kv-retrieval-keys=1,4 \
      "--kv-fail=retrieval_acc[retrieval@8168]: fp8 >= auto - 0.1" \
      "--kv-fail=retrieval_acc[retrieval@8168]: int8 >= auto - 0.1"
    write_recorded /tmp/kvaa \
      --kv-arms=auto,auto --kv-replicates="${AA_BOOTS:-4}" -m "short or depth" "${common[@]}" \
      --kv-warmups=1 --kv-runs=3 --kv-max-tokens=512 --kv-depths=2k,7k
    if [ "${2:-}" = aa ]; then
      launch_recorded /tmp/kvaa
    else
      launch_recorded /tmp/kvretrieval "[ -e /tmp/kvretrieval/no-aa ] || bash /tmp/kvaa/driver.sh"
    fi
    ;;
  collect)
    case "${2:?retrieval|aa}" in
      retrieval) collect_recorded /tmp/kvretrieval retrieval.tar.gz ;;
      aa) collect_recorded /tmp/kvaa aa.tar.gz ;;
      *) echo "collect retrieval|aa" >&2; exit 4 ;;
    esac
    ;;
esac
