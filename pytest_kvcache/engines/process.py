"""The process launcher: the engine as a child process in its own process group on 127.0.0.1."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from pytest_kvcache.engines.base import (
    HOST,
    EngineError,
    evidence_env,
    redact_argv,
    redact_env,
    started,
)
from pytest_kvcache.interrupt import HURRY

TERM_GRACE_S = 20.0
KILL_GRACE_S = 10.0


def _libc_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` of a pytest-xdist worker's engine: SIGTERM to it when the thread that started it dies
    (Linux), so a worker killed outright — on this host or an ssh host, where no reaper of the controller's
    reaches — leaves no engine behind (the engine's own SIGTERM handling stops its children). A plain run
    keeps its engines' lives its own: the next run's reaper stops what a killed one left."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell a pid from a reused one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19])


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: ask the kernel whether the group exists at all
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def kill_group(pgid: int, *, term_grace_s: float = TERM_GRACE_S, wait: Callable[[float], None] | None = None) -> str:
    """SIGTERM a process group, wait, then SIGKILL what is left. Returns how it ended.

    A Ctrl-C (KeyboardInterrupt) while waiting out the grace escalates at once: the group is SIGKILLed,
    its exit awaited, and the interrupt re-raised — a second Ctrl-C never leaves the engine behind. So does
    `HURRY` (a Ctrl-C after the run was interrupted), without an exception.
    """
    if not group_members(pgid):
        return "already gone"
    pause = wait if wait is not None else time.sleep
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + term_grace_s
    try:
        while time.monotonic() < deadline and not HURRY.is_set():
            pause(0.1)
            if not group_members(pgid):
                return "terminated"
    except KeyboardInterrupt:
        _kill_now(pgid)
        raise
    _kill_now(pgid)
    return "killed"


def _kill_now(pgid: int) -> None:
    """SIGKILL a group and wait (uninterruptibly, up to ``KILL_GRACE_S``) until its members are gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline and group_members(pgid):
        try:
            time.sleep(0.05)
        except KeyboardInterrupt:  # a third Ctrl-C: the SIGKILL is sent; keep waiting for the group to go
            continue


class ProcessEngine:
    """Runs ``argv`` (the engine command with ``--host``/``--port`` already in it) until stopped."""

    def __init__(
        self,
        boot_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        env_overrides: Mapping[str, str],
        port: int,
        log_path: Path,
        startup_timeout_s: float,
        on_spawn: Callable[[ProcessEngine], None] | None = None,
        on_stop: Callable[[ProcessEngine], None] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.boot_id = boot_id
        self.die_with_parent = die_with_parent
        self.argv = list(argv)
        self.env = dict(env)
        self.env_overrides = dict(env_overrides)
        self.port = port
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.ready_s: float | None = None
        self.stop_outcome: str | None = None
        self._on_spawn = on_spawn
        self._on_stop = on_stop
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._last_pid: int | None = None
        #: How long ``stop()`` waits after SIGTERM; the run shortens it once it is interrupted.
        self.term_grace_s = TERM_GRACE_S

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        started(self, self._launch)

    def _launch(self, log: IO[bytes]) -> None:
        self._log = log
        self._log.write(f"# pytest-kvcache: {' '.join(redact_argv(self.argv))}\n".encode())
        self._log.flush()
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=die_with_parent if self.die_with_parent else None,
            )
        except OSError as exc:
            raise EngineError(f"{self.boot_id}: cannot run the engine command {self.argv[0]!r}: {exc}") from None
        if self._on_spawn is not None:
            self._on_spawn(self)

    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:

            def reap(seconds: float) -> None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=seconds)

            try:
                self.stop_outcome = kill_group(proc.pid, term_grace_s=self.term_grace_s, wait=reap)
            finally:
                with contextlib.suppress(subprocess.TimeoutExpired, KeyboardInterrupt):
                    proc.wait(timeout=KILL_GRACE_S)
            self._last_pid = proc.pid
            if self._on_stop is not None:
                self._on_stop(self)
        if self._log is not None:
            self._log.close()
            self._log = None

    def describe(self) -> dict[str, Any]:
        return {
            "launcher": "process",
            "url": self.url,
            "pid": self.pid or self._last_pid,
            "argv": redact_argv(self.argv),
            "env": {**evidence_env(self.env), **redact_env(self.env_overrides)},
            "ready_s": self.ready_s,
            "stop": self.stop_outcome,
        }
