# Sourced by the H200 scripts.
export PYTHONPATH="/tmp/site:$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

# start_plugin WORKDIR PYTEST_ARGS...: the plugin detached in WORKDIR (a bare project), its log in
# WORKDIR/pytest.log; collect.sh waits for it.
start_plugin() {
  local work=$1
  shift
  mkdir -p "$work"
  printf '[tool.pytest.ini_options]\naddopts = ["-p", "no:cacheprovider", "-rA"]\n' > "$work/pyproject.toml"
  (cd "$work" && setsid nohup python3 -m pytest -p pytest_kvcache.plugin "$@" > "$work/pytest.log" 2>&1 < /dev/null &
   echo "started pid $!")
}
