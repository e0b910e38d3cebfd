#!/usr/bin/env bash
# On the GPU machine (issue 46, item 2): vLLM's CUDA build's KV figures for each attention layout, the ground truth
# of the KV arithmetic on a GPU. After stage.sh (every part) and install.sh:
#   bash scripts/h200/kv-layouts.sh start     # detached: one eager boot per shape and KV dtype (~40-60 s each)
#   bash scripts/h200/kv-layouts.sh collect   # waits (<= 9 min), copies the records to $OUT/kv_layouts/gpu/
# Here: copy $OUT's records into tests/data/kv_layouts/gpu/; tests/unit/test_kv_layouts.py checks the plan on them.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/h200/env.sh
work=/tmp/kvlayouts
case "${1:-}" in
  start)
    rm -rf "$work" && mkdir -p "$work/data/gpu"
    {
      echo "cd ${PWD@Q}"
      echo "date +%s > $work/started"
      echo "export KV_LAYOUTS_DATA=$work/data"
      # the issue's own model first (its question), then the shapes of K's CPU tests, auto and fp8
      echo "python3 fixtures/kv_layouts.py --measure --gpu --work $work/m --kv-cache-dtype auto,fp8 gemma3-270m"
      echo "python3 fixtures/kv_layouts.py --measure --gpu --work $work/m --kv-cache-dtype auto --extra-args=--async-scheduling gemma3-270m"
      echo "python3 fixtures/kv_layouts.py --measure --gpu --work $work/m --kv-cache-dtype auto,fp8 llama gemma3 gpt-oss deepseek-v2-mla"
      echo "python3 fixtures/kv_layouts.py --measure --gpu --work $work/m --kv-cache-dtype auto granite4-hybrid"
      echo "echo \$? > $work/rc"
    } > "$work/driver.sh"
    setsid nohup bash "$work/driver.sh" > "$work/driver.log" 2>&1 < /dev/null &
    echo "started driver pid $!"
    ;;
  collect)
    out=${OUT:-/tmp/out}
    for _ in $(seq 1 100); do
      [ -e "$work/rc" ] && break
      sleep 5
    done
    [ -e "$work/rc" ] && echo "finished after $(( $(date +%s) - $(cat "$work/started") )) s" || echo "still running"
    cat "$work/driver.log"
    mkdir -p "$out/kv_layouts/logs"
    cp -r "$work/data/gpu" "$out/kv_layouts/"
    for f in "$work"/m/*.log; do [ -e "$f" ] && tail -c 20000 "$f" > "$out/kv_layouts/logs/$(basename "$f")"; done
    ls -la "$out/kv_layouts/gpu"
    ;;
  *) echo "usage: kv-layouts.sh start|collect" >&2; exit 2 ;;
esac
