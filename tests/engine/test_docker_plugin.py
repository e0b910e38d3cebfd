"""The docker launcher through pytest: a real two-arm run in containers of the local vLLM CPU image, and
the failure/interruption paths leaving no labelled container behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_kvcache.engines.docker import LABEL_SESSION
from pytest_kvcache.run.folder import read_records
from tests.engine.conftest import default_sigint, run_pytest

pytestmark = pytest.mark.engine


def labelled(client: Any, run_dir: Path | None = None) -> list[Any]:
    """Containers of one run (or of any pytest-kvcache run)."""
    label = LABEL_SESSION if run_dir is None else f"{LABEL_SESSION}={run_dir.name}"
    return list(client.containers.list(all=True, filters={"label": label}))


def test_two_arm_run_in_containers(tmp_path: Path, cpu_image: str, docker_client: Any) -> None:
    run = run_pytest(
        tmp_path,
        "--kv-launcher=docker",
        f"--kv-image={cpu_image}",
        "--kv-arms=auto,float16",
        "--kv-model=embedded:tiny-qwen3",  # mechanics: the random-weight model boots fastest
        "-m",
        "short",
        "--kv-warmups=0",
        "--kv-runs=2",
        "--kv-max-tokens=16",
    )
    assert run.returncode == 0, run.output
    assert "4 passed" in run.output
    for arm, dtype in (("auto", "auto"), ("float16", "float16")):
        evidence = run.evidence(arm)
        assert evidence["launcher"] == "docker" and evidence["status"] == "stopped"
        assert evidence["cache_config"]["cache_dtype"] == dtype
        command = evidence["config"]["command"]
        if dtype != "auto":
            assert command[command.index("--kv-cache-dtype") + 1] == dtype
        assert "--model" in command and command[command.index("--model") + 1] == "/model"
        assert evidence["image_id"] and evidence["config"]["labels"][LABEL_SESSION] == run.folder.name
    assert len(read_records(run.folder / "requests.jsonl")) == 2 * 2 * 2
    assert not labelled(docker_client, run.folder)


def test_failing_engine_leaves_no_container(tmp_path: Path, cpu_image: str, docker_client: Any) -> None:
    run = run_pytest(
        tmp_path,
        "--kv-launcher=docker",
        f"--kv-image={cpu_image}",
        "--kv-arms=auto",
        "--kv-model=embedded:tiny-qwen3",
        "-m",
        "short",
        "--kv-engine-args=--no-such-flag",
    )
    assert run.returncode == 1, run.output
    assert "engine exited with code 2 during startup" in run.output and "unrecognized arguments" in run.output
    assert not labelled(docker_client, run.folder)


def test_missing_image_fails_fast_with_its_name(tmp_path: Path, docker_client: Any) -> None:
    start = time.monotonic()
    run = run_pytest(
        tmp_path,
        "--kv-launcher=docker",
        "--kv-image=pytest-kvcache/absent:1",
        "--kv-arms=auto",
        "--kv-model=embedded:tiny-qwen3",
        "-m",
        "short",
    )
    assert time.monotonic() - start < 60
    assert "image 'pytest-kvcache/absent:1' is not present locally (pass --kv-pull to pull it)" in run.output


def test_sigint_mid_run_removes_the_container(tmp_path: Path, cpu_image: str, docker_client: Any) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--kv-launcher=docker",
            f"--kv-image={cpu_image}",
            "--kv-arms=auto",
            "--kv-model=embedded:tiny-qwen3",
            "-m",
            "short",
            "--kv-warmups=0",
            "--kv-runs=200",
            "--kv-max-tokens=64",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=default_sigint,  # a shell that started us in the background may ignore SIGINT
    )
    path = tmp_path / ".kvcache" / "runs" / "latest" / "requests.jsonl"
    try:
        deadline = time.monotonic() + 300
        while not (path.exists() and read_records(path)):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        run_dir = path.resolve().parent
        assert labelled(docker_client, run_dir)
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired as exc:
            printed = (exc.output or b"").decode(errors="replace")[-8000:]
            pytest.fail(f"the run did not end within 120 s of its Ctrl-C; it printed:\n{printed}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out.decode()
    assert not labelled(docker_client, run_dir)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
