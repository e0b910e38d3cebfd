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

# write_recorded WORKDIR PYTEST_ARGS...: the driver of one recorded run, not started: it records the start time
# (WORKDIR/started) and pytest's exit code (WORKDIR/rc); collect_recorded waits for it.
write_recorded() {
  local work=$1
  shift
  mkdir -p "$work"
  printf '[tool.pytest.ini_options]\naddopts = ["-p", "no:cacheprovider", "-rA"]\n' > "$work/pyproject.toml"
  {
    echo "cd ${work@Q}"
    echo "date +%s > started"
    echo "python3 -m pytest -p pytest_kvcache.plugin ${*@Q} > pytest.log 2>&1"
    echo "echo \$? > rc"
  } > "$work/driver.sh"
  rm -f "$work/rc" "$work/started"
}

# launch_recorded WORKDIR [THEN]: run WORKDIR's driver detached (setsid), then the shell command THEN (a second
# driver, run after the first whatever its exit code).
launch_recorded() {
  local work=$1 then=${2:-true}
  setsid nohup bash -c "bash ${work@Q}/driver.sh; $then" > "$work/driver.log" 2>&1 < /dev/null &
  echo "started driver pid $! in $work"
}

# start_recorded WORKDIR PYTEST_ARGS...: as start_plugin, through a recorded driver (write_recorded).
start_recorded() {
  write_recorded "$@"
  launch_recorded "$1"
}

# collect_recorded WORKDIR ARCHIVE: wait (≤ WAIT seconds, default 530: a call's 10 minutes less the packing) for
# the run start_recorded began, say how it ended and how long it took, and pack its run folder and pytest.log
# into $OUT/ARCHIVE. Repeat until "finished".
collect_recorded() {
  local work=$1 archive=$2 out=${OUT:-/tmp/out} waited=0
  while [ ! -e "$work/rc" ] && [ "$waited" -lt "${WAIT:-530}" ]; do
    sleep 5
    waited=$((waited + 5))
  done
  if [ -e "$work/rc" ]; then
    echo "finished: exit code $(cat "$work/rc") after $(( $(stat -c %Y "$work/rc") - $(cat "$work/started") )) s"
  elif [ -e "$work/started" ]; then
    echo "still running ($(( $(date +%s) - $(cat "$work/started") )) s so far)"
  else
    echo "not started yet"
    return 0
  fi
  grep -E "^kvcache: " "$work/pytest.log" | tail -20 || true
  tail -40 "$work/pytest.log"
  mkdir -p "$out"
  local run
  run=$(readlink -f "$work/.kvcache/runs/latest" || true)
  if [ -n "$run" ] && [ -d "$run" ]; then
    tar czf "$out/$archive" -C "$(dirname "$run")" "$(basename "$run")"
    cp "$work/pytest.log" "$out/${archive%%.*}-pytest.log"
  fi
  ls -la "$out"
}
