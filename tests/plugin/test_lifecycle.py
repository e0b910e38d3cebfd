"""Boots, teardown, failures and interruptions, driven through pytest with the stand-in engine.

Runs use ``runpytest_subprocess``: an in-process run would drop and re-import httpx's transport
modules between runs (pytester's sys.modules snapshot), mixing two copies of its exception classes.

The stand-in (``pytest_kvcache.testing.standin``) is a real process serving real HTTP; it replaces vLLM only
for failures vLLM cannot be made to produce on cue. The same paths run on real vLLM in tests/engine.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from pytest_kvcache.engines.registry import reap_orphans
from pytest_kvcache.run.folder import read_records
from pytest_kvcache.selfcheck.stream import StreamServer
from tests.plugin.conftest import processes_with, spawn_pytest

BAD_ARMS = """
[tool.pytest_kvcache.arms.exits]
args = ["--standin-exit-at-start=2"]
[tool.pytest_kvcache.arms.slow]
args = ["--standin-startup-delay=30"]
[tool.pytest_kvcache.arms.liar]
args = ["--standin-report-dtype=fp8_e5m2"]
[tool.pytest_kvcache.arms.dies]
args = ["--standin-die-after=2"]
"""


def run_dir(pytester: pytest.Pytester) -> Path:
    return (pytester.path / ".kvcache" / "runs" / "latest").resolve()


def test_two_arms_boot_one_after_the_other(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    result = pytester.runpytest_subprocess("--kv-arms=auto,float16", *standin_args)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "*= kvcache =*",
            "run folder: *",
            "auto: declared auto → cache_dtype=auto, kv_cache_size_tokens=65536*",
            "float16: declared float16 → cache_dtype=float16*",
            "Short-context probes (measured samples*",
            "*code*wall_tps*auto*2*",
        ]
    )
    folder = run_dir(pytester)
    records = read_records(folder / "requests.jsonl")
    assert len(records) == 2 * 2 * 3
    assert [r["arm"] for r in records] == ["auto"] * 6 + ["float16"] * 6
    assert all(r["ok"] and r["schema_version"] == 1 for r in records)
    assert {r["phase"] for r in records} == {"warmup", "measured"}
    auto = json.loads((folder / "arms" / "auto" / "evidence.json").read_text())
    f16 = json.loads((folder / "arms" / "float16" / "evidence.json").read_text())
    assert auto["status"] == f16["status"] == "stopped"
    assert auto["stopped_unix_s"] <= f16["started_unix_s"], "arm A must stop before arm B boots"
    assert auto["cache_config"]["cache_dtype"] == "auto" and f16["cache_config"]["cache_dtype"] == "float16"
    assert "--kv-cache-dtype" in f16["argv"] and f16["argv"][f16["argv"].index("--kv-cache-dtype") + 1] == "float16"
    assert "--enable-prompt-tokens-details" in auto["argv"]
    assert (folder / "arms" / "auto" / "engine.log").read_text().count("Initializing a V1 LLM engine") == 1
    run = json.loads((folder / "run.json").read_text())
    assert run["status"] == "finished" and [p["boot"] for p in run["plan"]] == ["auto", "float16"]
    assert json.loads((folder / "engines.json").read_text())["engines"] == {}


def test_startup_exit_errors_that_arm_only(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    pytester.makepyprojecttoml(BAD_ARMS)
    result = pytester.runpytest_subprocess("--kv-arms=auto,exits", *standin_args)
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*exits: engine exited with code 2 during startup after * s (http://127.0.0.1:*): "
            "ValueError: standin told to fail at start",
            "*last lines of the engine log:*",
        ]
    )
    assert "Traceback" not in result.stdout.str()
    evidence = json.loads((run_dir(pytester) / "arms" / "exits" / "evidence.json").read_text())
    assert evidence["status"] == "failed" and "code 2" in evidence["error"]
    result.stdout.fnmatch_lines(["exits: FAILED — exits: engine exited with code 2*"])


def test_startup_timeout(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    pytester.makepyprojecttoml(BAD_ARMS)
    result = pytester.runpytest_subprocess("--kv-arms=slow", *standin_args, "--kv-startup-timeout=1.5", "-m", "short")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*slow: not ready at http://127.0.0.1:* after * s (startup timeout 1.5 s*"])


def test_port_taken(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = pytester.runpytest_subprocess("--kv-arms=auto", *standin_args, f"--kv-port={port}")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines([f"*auto: port {port} on 127.0.0.1 is already in use*"])


def test_resolved_dtype_must_match_the_declared_one(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    pytester.makepyprojecttoml(BAD_ARMS)
    result = pytester.runpytest_subprocess("--kv-arms=auto,liar", *standin_args)
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(["*liar: declared kv_cache_dtype auto but the engine reports cache_dtype=fp8_e5m2*"])


def test_engine_death_mid_run_is_reported_not_waited_on(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    pytester.makepyprojecttoml(BAD_ARMS)
    start = time.monotonic()
    result = pytester.runpytest_subprocess("--kv-arms=dies,auto", *standin_args, "--kv-stall-timeout=60")
    assert time.monotonic() - start < 50, "a dead engine must not be waited on until timeouts"
    result.assert_outcomes(passed=2, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_short[[]dies-code]*",
            "dies: engine died (exit code 3)",
            "*RuntimeError: standin died",
            "(the engine died before this test)",
            "*short narrative on dies: measured request 0 failed: engine_died: dies: engine died (exit code 3)*",
        ]
    )
    records = read_records(run_dir(pytester) / "requests.jsonl")
    died = [r for r in records if r["error_kind"] == "engine_died"]
    assert len(died) == 1 and died[0]["phase"] == "measured" and "standin died" in died[0]["error"]


def test_external_endpoints(pytester: pytest.Pytester) -> None:
    with StreamServer(model_name="ext") as server:
        result = pytester.runpytest_subprocess(
            "--kv-arms=auto",
            "--kv-launcher=external",
            f"--kv-endpoint=auto={server.url}",
            "--kv-warmups=0",
            "--kv-runs=2",
            "--kv-max-tokens=4",
            "--kv-replicates=3",
            "-m",
            "short",
        )
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["auto.r1: declared auto → cache_dtype=auto*"])
    # Nothing was booted: three "replicates" are repeats against one server, and the report says so.
    report = json.loads((run_dir(pytester) / "report.json").read_text())
    assert report["ci"]["method"] == "within-boot" and report["ci"]["boots_per_arm"] == {"auto": 1}
    assert report["ci"]["text"].startswith("CIs cover repeats against one server per arm only")
    assert "over boots" not in report["ci"]["text"].split(" for CIs over boots")[0]


def test_unreachable_external_endpoint(pytester: pytest.Pytester) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = pytester.runpytest_subprocess(
        "--kv-arms=auto",
        "--kv-launcher=external",
        f"--kv-endpoint=auto=http://127.0.0.1:{port}",
        "--kv-startup-timeout=1",
        "-m",
        "short",
    )
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*auto: external endpoint unreachable — auto: not ready at http://127.0.0.1:*"])


def _kill_and_reap(pytester: pytest.Pytester, proc: subprocess.Popen[bytes]) -> None:
    """If a test fails half-way, leave no pytest nor engine behind (a SIGKILLed pytest orphans its engine)."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate(timeout=10)
    reap_orphans(pytester.path / ".kvcache" / "runs")


def _wait_for_records(pytester: pytest.Pytester, proc: subprocess.Popen[bytes], count: int = 1) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        path = pytester.path / ".kvcache" / "runs" / "latest" / "requests.jsonl"
        if path.exists() and len(read_records(path)) >= count:
            return
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        time.sleep(0.1)
    pytest.fail("no request was recorded within 60 s")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_mid_run_stops_the_engine_and_keeps_records(
    pytester: pytest.Pytester, standin_args: list[str], tag: str, signum: int
) -> None:
    slow = [a for a in standin_args if not a.startswith(("--kv-runs", "--kv-max-tokens"))]
    proc = spawn_pytest(
        pytester,
        "--kv-arms=auto,float16",
        *slow,
        "--kv-runs=50",
        "--kv-max-tokens=200",
        f"--kv-engine-args={tag} --standin-itl=0.01",
    )
    try:
        _wait_for_records(pytester, proc, 2)
        assert processes_with(tag), "the engine should be running mid-run"
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
    finally:
        _kill_and_reap(pytester, proc)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out.decode()
    assert not processes_with(tag)
    folder = run_dir(pytester)
    assert len(read_records(folder / "requests.jsonl")) >= 2
    assert json.loads((folder / "run.json").read_text())["status"] == "interrupted"


def test_a_new_run_reaps_engines_left_by_a_killed_run(
    pytester: pytest.Pytester, standin_args: list[str], tag: str
) -> None:
    slow = [a for a in standin_args if not a.startswith("--kv-runs")]
    proc = spawn_pytest(pytester, "--kv-arms=auto", *slow, "--kv-runs=500")
    try:
        _wait_for_records(pytester, proc, 1)
        proc.kill()  # SIGKILL: no teardown can run, the engine is orphaned
        proc.communicate(timeout=10)
        assert processes_with(tag), "the orphaned engine should still be running"
    except BaseException:
        _kill_and_reap(pytester, proc)
        raise
    result = pytester.runpytest_subprocess("--kv-arms=auto", *standin_args, "-m", "short")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["reaped engine 'auto' (process group *) left running by dead run *: terminated"])
    assert not processes_with(tag)


KV_OPENAI_PROBE = """
import pytest

pytestmark = pytest.mark.short


def test_untimed_call(kv_server, kv_openai, kv_settings):
    reply = kv_openai.chat.completions.create(
        model=kv_server.model, messages=[{"role": "user", "content": "Name one prime."}], max_tokens=5
    )
    assert str(kv_openai.base_url).rstrip("/") == kv_server.url + "/v1"
    assert kv_openai.timeout == kv_settings.request_timeout_s and kv_openai.max_retries == 0
    assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens == 5
"""


def test_kv_openai_is_an_openai_client_on_the_arms_server(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    """A user's probe gets ``openai.OpenAI`` pointed at each arm's server for calls that are not timed; they
    are not recorded (the stock probes' records are the only ones)."""
    pytester.makepyfile(test_mine=KV_OPENAI_PROBE)
    result = pytester.runpytest_subprocess("--kv-arms=auto,float16", *standin_args, "--kv-no-suite", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_untimed_call?auto? PASSED*", "*test_untimed_call?float16? PASSED*"])
    records = pytester.path / ".kvcache" / "runs" / "latest" / "requests.jsonl"
    assert not records.exists() or not read_records(records)
