#!/usr/bin/env bash
# The main job: set up, then a real A/B on the embedded default (vLLM's CPU build, tiny model, dummy
# weights) — baseline `auto` against `fp8` (fp8_e4m3 KV). vLLM's CPU build serves an FP8 KV cache only
# on x86 CPUs with AVX-512 or AMX; on other CPUs the second arm is `float16` KV instead, and this
# script says so. Extra arguments go to pytest (e.g. --kv-runs=10).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv=$(cd "${KV_VENV:-.venv}" && pwd)
second=${KV_SECOND_ARM:-}
if [ -z "$second" ]; then
  reason=$("$venv/bin/python" -c "from pytest_kvcache.config.hostcpu import fp8_kv_unsupported_reason as r; print(r() or '')")
  if [ -n "$reason" ]; then
    echo "ab-demo: $reason — comparing auto against float16 KV instead of fp8."
    second=float16
  else
    second=fp8
  fi
fi
cd examples/quickstart
exec "$venv/bin/python" -m pytest --kv-arms="auto,$second" -m short "$@"
