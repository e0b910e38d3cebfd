#!/usr/bin/env bash
# CPython 3.12 wheels of what benchmarks/harness.py imports, for the GPU machine (scripts/h200/perf.sh):
# numpy and pandas in .gpu/perf_a (carry only if the image lacks them), the rest in .gpu/perf_b.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu/perf_a .gpu/perf_b
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d .gpu/perf_b aiohttp httpx numpy pandas openai uvloop httptools
mv .gpu/perf_b/numpy-* .gpu/perf_b/pandas-* .gpu/perf_a/
du -sh .gpu/perf_a .gpu/perf_b
