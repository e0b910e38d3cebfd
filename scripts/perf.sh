#!/usr/bin/env bash
# Regenerate docs/performance.md: the measuring harness against the calibrated stream (benchmarks/harness.py),
# then our client next to `vllm bench serve` and the engine's /metrics on one real vLLM CPU server
# (benchmarks/vs_vllm_bench.py), then the page (benchmarks/perfdoc.py). About 15 minutes on 2 cores.
#   bash scripts/perf.sh                  everything
#   PERF_QUICK=1 bash scripts/perf.sh     shorter harness runs
#   PERF_SKIP_VLLM=1 bash scripts/perf.sh without the real-engine comparison
#   PERF_SERVERS=N                        calibrated-server processes on one port (default 2)
#   PERF_OTHER_JSON=FILE                  the harness run of another machine shown beside this one (default: the
#                                         16-core run in docs/results/perf-h200-cpu/, from scripts/h200/perf.sh)
# Measure on a quiet machine: it waits up to PERF_WAIT_S (300) seconds for the 1-minute load average to fall
# below PERF_MAX_LOAD (1.5), then runs anyway and the page states the load.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
max_load=${PERF_MAX_LOAD:-1.5}
wait_s=${PERF_WAIT_S:-300}
out=$(mktemp -d "${TMPDIR:-/tmp}/kvcache-perf.XXXXXX")

load1() { cut -d' ' -f1 /proc/loadavg; }
waited=0
while awk -v l="$(load1)" -v m="$max_load" 'BEGIN { exit !(l > m) }' && [ "$waited" -lt "$wait_s" ]; do
  [ "$waited" -eq 0 ] && echo "perf: load average $(load1) > $max_load; waiting up to ${wait_s}s for a quieter machine"
  sleep 10
  waited=$((waited + 10))
done

commit=$(git rev-parse --short HEAD)
[ -n "$(git status --porcelain)" ] && commit="$commit+dirty"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
quick=()
[ -n "${PERF_QUICK:-}" ] && quick=(--quick)

harness=(benchmarks/harness.py "${quick[@]}" --servers "${PERF_SERVERS:-2}" --json "$out/harness.json")
versus=(benchmarks/vs_vllm_bench.py --requests "${PERF_REQUESTS:-10}" --json "$out/versus.json" --workdir "$out/vllm")
echo "perf: $python ${harness[*]}"
"$python" "${harness[@]}"
if [ -z "${PERF_SKIP_VLLM:-}" ]; then
  echo "perf: $python ${versus[*]}"
  "$python" "${versus[@]}"
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

"$python" - "$out/meta.json" "$commit" "$load_before" "$load_after" "${quick[*]}" "${PERF_REQUESTS:-10}" \
  "${PERF_SKIP_VLLM:-}" "${PERF_SERVERS:-2}" <<'PY'
import datetime, json, sys
path, commit, before, after, quick, requests, skip, servers = sys.argv[1:]
commands = ["bash scripts/perf.sh   # runs:", f"python benchmarks/harness.py {quick} --servers {servers} --json harness.json".replace("  ", " ")]
if not skip:
    commands.append(f"python benchmarks/vs_vllm_bench.py --requests {requests} --json versus.json")
commands.append("python benchmarks/perfdoc.py --harness harness.json --versus versus.json --meta meta.json --other docs/results/perf-h200-cpu/harness.json --out docs/performance.md")
meta = {
    "commit": commit,
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "load_before": before,
    "load_after": after,
    "commands": commands,
}
json.dump(meta, open(path, "w"), indent=1)
PY
other=${PERF_OTHER_JSON:-docs/results/perf-h200-cpu/harness.json}
"$python" benchmarks/perfdoc.py --harness "$out/harness.json" --versus "$out/versus.json" --meta "$out/meta.json" \
  --other "$other" --out docs/performance.md
echo "perf: wrote docs/performance.md (raw results in $out)"
