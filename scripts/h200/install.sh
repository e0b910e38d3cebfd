#!/usr/bin/env bash
# On the GPU machine: vLLM 0.25.1 into /tmp/site (from the staged parts), the plugin's extra deps into
# the image's site-packages (only what is missing), then a smoke import.
set -euo pipefail
cd /tmp/wh
if [ ! -d /tmp/site/vllm ]; then
  cat part[0-9]* > all.tar
  mkdir -p whl && tar xf all.tar -C whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site whl/*.whl
fi
python3 -m pip install -q --no-index --find-links /tmp/wh/extra httpx prometheus_client matplotlib jinja2 pytest-xdist httptools uvloop 2>&1 | tail -2 || true
PYTHONPATH=/tmp/site python3 -c "import vllm, httpx, prometheus_client, matplotlib, pandas, pynvml, jinja2, xdist, httptools, uvloop; print('vllm', vllm.__version__)"
