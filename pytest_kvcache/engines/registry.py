"""Which engines a run has alive, on disk, so a later run can reap what a dead run left behind."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from pytest_kvcache.engines.process import group_members, kill_group, proc_start_ticks
from pytest_kvcache.jsonio import iter_run_folders, write_json

REGISTRY = "engines.json"


class EngineRegistry:
    """``<run>/engines.json``: the owning pytest pid and every live engine's process group."""

    def __init__(self, run_path: Path) -> None:
        self.path = run_path / REGISTRY
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] = {}
        self._owner = {"pid": os.getpid(), "start_ticks": proc_start_ticks(os.getpid())}
        self._flush()

    def _flush(self) -> None:
        write_json(self.path, {"owner": self._owner, "engines": self._entries})

    def add(self, key: str, pid: int, **extra: Any) -> None:
        with self._lock:
            self._entries[key] = {"pid": pid, "pgid": pid, "start_ticks": proc_start_ticks(pid), **extra}
            self._flush()

    def remove(self, key: str) -> None:
        with self._lock:
            if self._entries.pop(key, None) is not None:
                self._flush()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _alive(pid: int | None, start_ticks: int | None) -> bool:
    """Is ``pid`` the same live process (not reused, not a zombie: a killed pytest-xdist worker stays one
    until its controller waits for it)?"""
    if pid is None or _zombie(pid):
        return False
    ticks = proc_start_ticks(pid)
    return ticks is not None and (start_ticks is None or ticks == start_ticks)


def reap_orphans(report_root: Path) -> list[str]:
    """Stop engines (process groups) registered by runs whose pytest process is gone. Returns messages."""
    messages: list[str] = []
    for run in iter_run_folders(report_root):
        path = run / REGISTRY
        if not path.exists():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        owner = data.get("owner") or {}
        if _alive(owner.get("pid"), owner.get("start_ticks")):
            continue
        engines = data.get("engines") or {}
        for key, entry in engines.items():
            pgid = entry.get("pgid")
            if not isinstance(pgid, int):
                continue
            leader_alive = proc_start_ticks(pgid) is not None
            if leader_alive and not _alive(pgid, entry.get("start_ticks")):
                continue  # the pid was reused by an unrelated process
            if not group_members(pgid):
                continue
            outcome = kill_group(pgid, term_grace_s=10.0)
            messages.append(
                f"reaped engine {key!r} (process group {pgid}) left running by dead run {run.name}: {outcome}"
            )
        if engines:
            with contextlib.suppress(OSError):
                write_json(path, {"owner": owner, "engines": {}, "reaped": sorted(engines)})
    return messages
