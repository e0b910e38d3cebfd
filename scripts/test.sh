#!/usr/bin/env bash
# Set up, then run the whole test suite: lint, types, the fast unit/plugin tier, the real-engine tier.
#   bash scripts/test.sh                 everything
#   bash scripts/test.sh -m "not engine" the fast tier only (seconds)
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 3
venv=${KV_VENV:-.venv}
"$venv/bin/ruff" check pytest_kvcache tests fixtures examples scripts benchmarks conftest.py || exit 1
"$venv/bin/ruff" format --check pytest_kvcache tests fixtures examples scripts benchmarks conftest.py || exit 1
"$venv/bin/mypy" || exit 1
exec "$venv/bin/python" -m pytest "$@"
