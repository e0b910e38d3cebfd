from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

STANDIN = f"{sys.executable} -m pytest_kvcache.standin"


def processes_with(tag: str) -> list[int]:
    """Live stand-in engine processes whose arguments include ``tag`` (pytest's own argv is not one)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "pytest_kvcache.standin" in argv[:3] and tag in argv and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture
def tag() -> Iterator[str]:
    """A unique marker put on the stand-in engines' command lines, to find leaked ones."""
    value = f"--standin-tag={uuid.uuid4().hex[:12]}"
    yield value
    leaked = processes_with(value)
    assert not leaked, f"engine processes leaked: {leaked}"


@pytest.fixture
def standin_args(tag: str) -> list[str]:
    """pytest arguments that run arms on the stand-in engine with small probe counts."""
    return [
        f"--kv-engine-cmd={STANDIN}",
        f"--kv-engine-args={tag}",
        "--kv-warmups=1",
        "--kv-runs=2",
        "--kv-max-tokens=8",
        "--kv-startup-timeout=20",
        "--kv-no-self-check",  # ~1.5 s per run; test_self_check_is_in_every_runs_evidence runs it
        "-p",
        "no:cacheprovider",
        "-m",
        "short",
    ]
