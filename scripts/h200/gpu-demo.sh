#!/usr/bin/env bash
# On the GPU machine: an NVML snapshot and the sampler around a ~30 s bf16 matmul load (read-only NVML).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/h200/env.sh
out=${OUT:-/tmp/out}
mkdir -p "$out"
python3 scripts/h200/gpu_demo.py "$out/gpu-demo.json"
