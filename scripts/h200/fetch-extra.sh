#!/usr/bin/env bash
# The plugin's own dependencies the H200 image may lack, as CPython 3.12 wheels, into .gpu/extra.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu/extra
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  --no-deps -d .gpu/extra httpx httpcore h11 anyio sniffio idna certifi prometheus_client matplotlib contourpy \
  cycler fonttools kiwisolver pillow pyparsing jinja2 markupsafe pytest-xdist execnet httptools uvloop
du -sh .gpu/extra
