from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import matplotlib
import numpy
import pandas
import pytest

from tests.procs import live_processes

matplotlib.use("Agg")
import matplotlib.pyplot

from pytest_kvcache.testing import standin

# The plugin imports numpy, pandas and matplotlib only once a run is active; pytester's in-process runs
# restore sys.modules afterwards, so a module first imported inside one would be imported again in the
# next ("The NumPy module was reloaded"). Importing them here keeps them loaded across runs.
_HEAVY = (matplotlib, matplotlib.pyplot, numpy, pandas)

STANDIN = standin.engine_cmd()


def processes_with(tag: str) -> list[int]:
    """Live stand-in engine processes whose arguments include ``tag`` (pytest's own argv is not one)."""
    return live_processes(lambda argv: standin.MODULE in argv[:3] and tag in argv)


@pytest.fixture(autouse=True)
def default_run_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """These runs keep their store where a user's would be (under pytester's HOME): a PYTEST_KVCACHE_STORE
    left in the environment (the engine tier's private store lives for the whole session) is taken away."""
    monkeypatch.delenv("PYTEST_KVCACHE_STORE", raising=False)


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
        # no host-CPU sampling: on a loaded CI host a one-boot verdict would be judged with the widest spread
        # (report.spread), and these tests check the logic, not the host; test_hostload turns it on
        "--kv-host-cpu-max=off",
        "-p",
        "no:cacheprovider",
        "-m",
        "short",
    ]


def with_counts(standin_args: list[str], *, warmups: int, runs: int, extra: tuple[str, ...] = ()) -> list[str]:
    """``standin_args`` with other warmup/run counts, then ``extra``."""
    kept = [a for a in standin_args if not a.startswith(("--kv-warmups", "--kv-runs"))]
    return [*kept, f"--kv-warmups={warmups}", f"--kv-runs={runs}", *extra]


def latest(pytester: pytest.Pytester) -> Path:
    """The newest run folder of a pytester project (``.kvcache/runs/latest``)."""
    return (pytester.path / ".kvcache" / "runs" / "latest").resolve()


def spawn_pytest(pytester: pytest.Pytester, *args: str, new_session: bool = False) -> subprocess.Popen[bytes]:
    """pytest in a child process of its own (to send it signals), unbuffered, output to one pipe."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *args],
        cwd=pytester.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=new_session,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # even when our shell ignores SIGINT
    )


def kill_leftovers(proc: subprocess.Popen[bytes], tag: str) -> None:
    """After a signal test, whatever happened: no pytest (its group) and no tagged engine stays."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
    for pid in processes_with(tag):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def tiny_embedded_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin tier runs arms on the stand-in engine, which serves no weights: the random-weight tiny
    model (``embedded:tiny-qwen3``) spares every run the trained model's conversion and its float32-only KV
    rule. A test of the trained default deletes the variable (``monkeypatch.delenv``)."""
    monkeypatch.setenv("PYTEST_KVCACHE_MODEL", "embedded:tiny-qwen3")
