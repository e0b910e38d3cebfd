#!/usr/bin/env bash
# The measuring-client harness as a CPU-only benchmark on the GPU machine's 16 cores (docs/performance.md).
# Here: bash scripts/h200/fetch-perf.sh (CPython 3.12 wheels of what the harness imports, in .gpu/perf_a|b).
# There, calls back to back:
#   bash scripts/h200/perf.sh stage      (carry .gpu/perf_b, then .gpu/perf_a if the image lacks numpy/pandas)
#   bash scripts/h200/perf.sh start      installs what is missing into /tmp/perfsite, starts the harness detached
#   bash scripts/h200/perf.sh collect    waits up to 9 min; copies harness.json and the log to $OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
work=/tmp/kvperf
case "${1:-}" in
  stage)
    mkdir -p /tmp/wh/perf
    for d in .gpu/perf_a .gpu/perf_b; do [ -d "$d" ] && cp "$d"/* /tmp/wh/perf/; done
    ls /tmp/wh/perf | wc -l
    python3 - <<'PY'
import importlib.util
for m in ("numpy", "pandas", "aiohttp", "httpx", "openai", "uvloop", "httptools"):
    print(m, "present" if importlib.util.find_spec(m) else "missing")
PY
    nproc; python3 --version ;;
  start)
    mkdir -p "$work" /tmp/perfsite
    missing=$(python3 - <<'PY'
import importlib.util
print(" ".join(m for m in ("numpy", "pandas", "aiohttp", "httpx", "openai", "uvloop", "httptools")
               if not importlib.util.find_spec(m)))
PY
)
    if [ -n "$missing" ]; then
      python3 -m pip install -q --no-index --find-links /tmp/wh/perf --target /tmp/perfsite $missing 2>&1 | tail -3
    fi
    PYTHONPATH="$PWD:/tmp/perfsite" python3 -c "import numpy, pandas, aiohttp, httpx, openai, uvloop, httptools, pytest_kvcache.fanout; print('imports ok')"
    cp -r . "$work/repo" 2>/dev/null || true
    cd "$work/repo"
    PYTHONPATH="$work/repo:/tmp/perfsite" setsid nohup python3 benchmarks/harness.py ${PERF_ARGS:---only accuracy --only many --servers 6 --many-stacks "ours: http.client, thread/stream;aiohttp, uvloop;ours: fanout, 1 process;ours: fanout, 2 processes;ours: fanout, 4 processes"} \
      --json "$work/harness.json" > "$work/harness.log" 2>&1 < /dev/null &
    echo "started $!" ;;
  collect)
    mkdir -p "$OUT"
    for _ in $(seq 1 108); do
      if [ -s "$work/harness.json" ]; then break; fi
      sleep 5
    done
    cp "$work/harness.log" "$OUT/" 2>/dev/null || true
    [ -s "$work/harness.json" ] && cp "$work/harness.json" "$OUT/" && echo done || { tail -5 "$work/harness.log"; echo "not finished"; } ;;
  *) echo "usage: $0 stage|start|collect" >&2; exit 2 ;;
esac
