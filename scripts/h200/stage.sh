#!/usr/bin/env bash
# On the GPU machine: keep the carried part (or extra wheels) in /tmp/wh, which survives while it is warm.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p /tmp/wh/extra
for d in .gpu/part_* .gpu/b_[0-9]*; do [ -d "$d" ] && cp "$d"/* /tmp/wh/; done
[ -d .gpu/extra ] && cp .gpu/extra/* /tmp/wh/extra/ || true
ls -la /tmp/wh | tail -n +2
