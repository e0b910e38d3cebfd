#!/usr/bin/env bash
# On the GPU machine: `collect.sh WORKDIR ARCHIVE` waits (≤ 9 min) for the detached plugin run in WORKDIR,
# prints its log's tail and packs its run folder into $OUT/ARCHIVE (with pytest.log).
set -euo pipefail
work=${1:?WORKDIR} archive=${2:?ARCHIVE}
out=${OUT:-/tmp/out}
cd "$work"
for _ in $(seq 1 108); do
  pgrep -f "pytest -p pytest_kvcache.plugin" > /dev/null || break
  sleep 5
done
pgrep -f "pytest -p pytest_kvcache.plugin" > /dev/null && echo "still running" || echo "finished"
tail -60 pytest.log
mkdir -p "$out"
run=$(readlink -f .kvcache/runs/latest || true)
[ -n "$run" ] && tar czf "$out/$archive" -C "$(dirname "$run")" "$(basename "$run")" && cp pytest.log "$out/"
ls -la "$out"
