# Sourced by the H200 scripts.
export PYTHONPATH="/tmp/site:$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
