"""Finding engine processes a test started (and must not leak), by their command line."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any


def live_processes(matches: Callable[[list[str]], bool]) -> list[int]:
    """Live (not zombie) processes whose argv ``matches``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and matches(argv):
            found.append(int(entry.name))
    return found


def end_process(proc: Any, grace_s: float = 10.0) -> None:
    """A server a test started by hand: SIGTERM, then SIGKILL past ``grace_s`` (how fast it exits is not what the
    test checks; a loaded CI host once kept a stand-in alive 10 s past its SIGTERM), reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)
