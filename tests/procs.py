"""Finding engine processes a test started (and must not leak), by their command line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


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
