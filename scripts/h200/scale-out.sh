#!/usr/bin/env bash
# On the GPU machine (issue 15): pytest-xdist scale-out on one H200 — the same 4 boots (fp8 vs
# int8_per_token_head, 2 replicates) run as two parallel lanes sharing the card (`-n 2`, one block of both
# arms per worker, A B on lane 0 and B A on lane 1) and then one after another (no -n), so the wall-time
# saving and the deltas can be put side by side. Eager engines (no torch.compile: two first boots would
# compile at once), 0.4 of the card's memory each, short + prefill at 4k/16k.
# `scale-out.sh start` launches one detached driver; `scale-out.sh collect` waits (≤ 9 min, repeatable) and
# packs both run folders and logs into $OUT.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/scripts/h200/env.sh"
work=/tmp/kvscale
engine="--load-format dummy --gpu-memory-utilization 0.4 --max-model-len 32768 --enforce-eager"
common=(--kv-arms=fp8,int8 "--kv-model=$repo/fixtures/qwen3-8b-shape" "--kv-engine-args=$engine" --kv-replicates=2
  --kv-progress=lines --kv-startup-timeout=900 -m "short or prefill" --kv-warmups=1 --kv-runs=3
  --kv-depths=4k,16k --kv-depth-warmups=1 --kv-depth-runs=2)
case "${1:?start|collect}" in
  start)
    mkdir -p "$work/parallel" "$work/sequential"
    for d in parallel sequential; do
      printf '[tool.pytest.ini_options]\naddopts = ["-p", "no:cacheprovider", "-rA"]\n' > "$work/$d/pyproject.toml"
    done
    cat > "$work/driver.sh" <<DRIVER
set -u
cd $work/parallel
date +%s > started
python3 -m pytest -p pytest_kvcache.plugin -p xdist -n 2 ${common[*]@Q} > pytest.log 2>&1
echo \$? > rc
date +%s > ended
cd $work/sequential
date +%s > started
python3 -m pytest -p pytest_kvcache.plugin ${common[*]@Q} > pytest.log 2>&1
echo \$? > rc
date +%s > ended
DRIVER
    setsid nohup bash "$work/driver.sh" > "$work/driver.log" 2>&1 < /dev/null &
    echo "driver pid $!"
    ;;
  collect)
    out=${OUT:-/tmp/out}
    mkdir -p "$out"
    for _ in $(seq 1 106); do
      [ -e "$work/sequential/rc" ] && break
      sleep 5
    done
    for d in parallel sequential; do
      [ -e "$work/$d/rc" ] || { echo "$d: still running"; continue; }
      echo "$d: rc=$(cat "$work/$d/rc") wall $(( $(cat "$work/$d/ended") - $(cat "$work/$d/started") )) s"
      tail -25 "$work/$d/pytest.log"
      run=$(readlink -f "$work/$d/.kvcache/runs/latest" || true)
      [ -n "$run" ] && tar czf "$out/$d.tar.gz" -C "$(dirname "$run")" "$(basename "$run")" && cp "$work/$d/pytest.log" "$out/$d-pytest.log"
    done
    ls -la "$out"
    ;;
esac
