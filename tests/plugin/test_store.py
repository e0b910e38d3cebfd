"""docs/gpu-runner.md's workflow, run twice on the stand-in engine: two CI jobs in one workspace, the
second after ``actions/checkout``'s ``git clean -ffdx``, sharing the runner's default run store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kvcache import cli
from pytest_kvcache.store.sqlite import SqliteStore

DOC = Path(__file__).parents[2] / "docs" / "gpu-runner.md"
GIT = ["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", "-c", "init.defaultBranch=main"]


def workflow_flags() -> tuple[str, str, str]:
    """The store flags the documented workflow uses: (main-branch job's save, every job's compare, report dir)."""
    text = DOC.read_text(encoding="utf-8")
    save = re.search(r"--kv-save=(\w+)", text)
    compare = re.search(r"--kv-compare=(\w+)", text)
    report_dir = re.search(r"--kv-report-dir=([\w-]+)", text)
    assert save and compare and report_dir, "docs/gpu-runner.md lost its workflow's store flags"
    assert "git clean -ffdx" in text and "kvcache-report history" in text
    return save.group(0), compare.group(0), report_dir.group(0)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def job(workspace: Path, home: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_KVCACHE_", "XDG_", "GITHUB_"))}
    env["HOME"] = str(home)  # the runner's user: its default store is ~/.local/share/pytest-kvcache
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=workspace, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_gpu_runner_workflow_survives_a_clean_checkout(
    tmp_path: Path, standin_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    save, compare, report_dir = workflow_flags()
    origin, workspace, home = tmp_path / "origin", tmp_path / "work", tmp_path / "home"
    origin.mkdir()
    git(origin, "init", "-q")
    (origin / "pyproject.toml").write_text('[project]\nname = "served"\nversion = "0"\n')
    git(origin, "add", ".")
    git(origin, "commit", "-q", "-m", "first")
    first_commit = git(origin, "rev-parse", "HEAD")
    common = [*standin_args, "--kv-arms=auto,float16", report_dir, "-p", "no:randomly"]

    # Job 1 on main: a fresh clone, the reference run stored.
    subprocess.run([*GIT, "clone", "-q", str(origin), str(workspace)], check=True)
    first = job(workspace, home, [*common, save])
    assert first.returncode == 0, first.stdout + first.stderr
    assert "stored this run as baseline main (" in first.stdout

    # A push, then job 2: actions/checkout fetches, checks out and cleans the workspace.
    (origin / "README").write_text("second\n")
    git(origin, "add", ".")
    git(origin, "commit", "-q", "-m", "second")
    second_commit = git(origin, "rev-parse", "HEAD")
    git(workspace, "fetch", "-q", "origin")
    git(workspace, "checkout", "-q", "-f", "-B", "main", "origin/main")
    git(workspace, "clean", "-ffdx")
    assert not (workspace / report_dir.split("=", 1)[1]).exists()
    assert not (workspace / "baselines").exists()
    gate = "--kv-fail=wall_tps[short@code]: >= saved * 0.01"
    second = job(workspace, home, [*common, compare, gate])
    assert second.returncode == 0, second.stdout + second.stderr
    assert "no stored baseline" not in second.stdout + second.stderr
    # one boot each side, 100× from the threshold: decided on the within-boot CI widened by the default band
    assert re.search(r"gate PASS: wall_tps\[short@code\]: >= saved \* 0.01 \(auto/saved\).*default CPU", second.stdout)

    store = home / ".local" / "share" / "pytest-kvcache"
    runs = workspace / report_dir.split("=", 1)[1]
    report = json.loads((runs / "latest" / "report.json").read_text())
    stored = json.loads((store / "baselines" / "main" / "run.json").read_text())
    assert report["compare"]["baseline_run"] == stored["run_id"]
    assert {g["outcome"] for g in report["gates"]} == {"pass"}
    assert {g["evidence"]["kind"] for g in report["gates"]} == {"default band"}
    with SqliteStore(store) as opened:
        rows = opened.runs()
    assert [(r["commit"], r["branch"]) for r in rows] == [(first_commit, "main"), (second_commit, "main")]
    assert rows[0]["comparability"] == rows[1]["comparability"]
    assert {p["arm"] for p in rows[1]["points"]} == {"auto", "float16"}
    # The workflow's last step: two comparable runs are too few to judge the newest, and say so.
    page = runs / "history.html"
    assert cli.main(["history", f"--store={store}", f"--html={page}", "--gate", "--min-shift", "2"]) == 0
    assert "history gate NOT JUDGED: " in capsys.readouterr().out and page.is_file()


def test_a_store_that_is_a_file_is_a_usage_error_before_anything_boots(
    pytester: pytest.Pytester, standin_args: list[str]
) -> None:
    (pytester.path / "store").write_text("not a folder\n")
    result = pytester.runpytest_subprocess(*standin_args, "--kv-arms=auto", "--kv-store=store")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-kvcache: --kv-store: */store is a file, not a store folder"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert not (pytester.path / ".kvcache").exists()


STANDIN_ARMS = """
[tool.pytest_kvcache.arms.fp8]
kv_cache_dtype = "float16"

[tool.pytest_kvcache.arms.int8]
kv_cache_dtype = "bfloat16"
args = ["--standin-itl", "0.012"]
"""


def test_the_gpu_runner_workflows_gate_fails_the_job_when_int8_misses_it_by_far(
    pytester: pytest.Pytester, standin_args: list[str]
) -> None:
    """The workflow's own gate (read from docs/gpu-runner.md), its arms as stand-ins: int8 streams tokens 6×
    slower than fp8 (12 ms apart instead of 2 ms). One boot per arm decides it: the job fails."""
    text = DOC.read_text(encoding="utf-8")
    gates = re.findall(r'--kv-fail="([^"]+)"', text)
    assert gates and re.search(r"--kv-arms=fp8,int8", text)
    gate = gates[0]
    assert "int8 >= fp8 * 1.00" not in gate, "the workflow's gate must not ask for parity"
    pytester.makepyprojecttoml(STANDIN_ARMS)
    args = [a for a in standin_args if not a.startswith("--kv-max-tokens")]
    result = pytester.runpytest_subprocess(
        *args, "--kv-max-tokens=32", "--kv-arms=fp8,int8", f"--kv-fail={gate}", "-p", "no:randomly"
    )
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*gate FAIL: decode_tps[[]short@*]: int8 >= fp8 * 0.9*", "*gate(s) failed: exit code 1*"]
    )
    report = json.loads((pytester.path / ".kvcache" / "runs" / "latest" / "report.json").read_text())
    assert report["ci"]["boots_per_arm"] == {"fp8": 1, "int8": 1}  # decided without adding boots
    assert {g["outcome"] for g in report["gates"]} == {"fail"}
