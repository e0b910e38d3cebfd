"""Real vLLM (CPU build): the plugin's main path and the failures a real engine produces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pytest_kvcache.records import read_records
from tests.engine.conftest import SECOND_ARM, SECOND_DTYPE, Run, run_pytest, vllm_processes

pytestmark = pytest.mark.engine


def test_ab_run_passes_and_leaves_nothing_running(ab_run: Run) -> None:
    assert ab_run.returncode == 0, ab_run.output
    assert "4 passed" in ab_run.output
    assert not vllm_processes(ab_run.tag)


def test_ab_evidence_shows_each_arms_resolved_cache(ab_run: Run) -> None:
    auto, second = ab_run.evidence("auto"), ab_run.evidence(SECOND_ARM)
    assert auto["cache_config"]["cache_dtype"] == "auto"
    assert second["cache_config"]["cache_dtype"] == SECOND_DTYPE
    assert auto["log"]["kv_cache_dtype"] == "auto" and second["log"]["kv_cache_dtype"] == SECOND_DTYPE
    auto_tokens = int(auto["cache_config"]["kv_cache_size_tokens"])
    second_tokens = int(second["cache_config"]["kv_cache_size_tokens"])
    # The same 2 GiB of KV space holds twice the tokens at one byte per element.
    assert second_tokens == (2 * auto_tokens if SECOND_DTYPE.startswith("fp8") else auto_tokens)
    for evidence in (auto, second):
        assert evidence["engine_version"] and evidence["max_model_len"] == 131072
        assert evidence["status"] == "stopped" and evidence["ready_s"] > 0
        assert evidence["stopped_unix_s"] <= second["started_unix_s"] or evidence is second
    lines = [line for line in ab_run.output.splitlines() if "→ cache_dtype=" in line]
    assert lines[0].startswith("auto: declared auto → cache_dtype=auto")
    assert lines[1].startswith(f"{SECOND_ARM}: declared {SECOND_DTYPE} → cache_dtype={SECOND_DTYPE}")


def test_ab_records_are_complete_and_token_identical(ab_run: Run) -> None:
    records = ab_run.records()
    assert len(records) == 2 * 2 * (1 + 3)
    assert all(r["ok"] for r in records), [r["error"] for r in records if not r["ok"]]
    # Greedy + ignore_eos: every arm decodes exactly max_tokens, so decode windows are comparable.
    assert {r["sample"]["completion_tokens"] for r in records} == {32}
    assert all(r["sample"]["token_clock"] == "usage" for r in records)
    measured = [r for r in records if r["phase"] == "measured"]
    assert all(r["metrics"]["decode_tps"] and r["metrics"]["ttft_s"] > 0 for r in measured)
    assert "short probes (measured samples" in ab_run.output


def test_engine_rejecting_an_argument_errors_with_its_log_tail(tmp_path: Path) -> None:
    run = run_pytest(tmp_path, "--kv-arms=auto", "--kv-engine-args=--no-such-flag", "-m", "short")
    assert run.returncode == 1, run.output
    assert "2 errors" in run.output
    assert "auto: engine exited with code 2 during startup" in run.output
    assert "unrecognized arguments: --no-such-flag" in run.output
    assert "last lines of the engine log:" in run.output
    assert "Traceback" not in run.output.split("= ERRORS =")[1].split("= kvcache =")[0]
    assert not vllm_processes(run.tag)


def test_ctrl_c_mid_run_stops_vllm_and_keeps_records(tmp_path: Path) -> None:
    tag = f"kvtest-{uuid.uuid4().hex[:10]}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--kv-arms=auto",
            "--kv-warmups=0",
            "--kv-runs=200",
            "--kv-max-tokens=64",
            f"--kv-engine-args=--served-model-name {tag}",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        path = tmp_path / ".kvcache" / "runs" / "latest" / "requests.jsonl"
        deadline = time.monotonic() + 300
        while not (path.exists() and len(read_records(path)) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        assert vllm_processes(tag)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out.decode()
    assert not vllm_processes(tag)
    assert len(read_records(path)) >= 2
