"""Report files, gates, baselines and re-rendering through pytest, on the stand-in engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_kvcache.run.folder import read_records
from tests.plugin.conftest import latest, with_counts

HOOK = """
import json, pathlib

def pytest_kvcache_report(config, report):
    path = pathlib.Path("hook-calls.jsonl")
    with path.open("a") as fh:
        fh.write(json.dumps({"run_id": report["run_id"], "arms": [a["name"] for a in report["arms"]]}) + "\\n")
"""


@pytest.fixture
def args(standin_args: list[str]) -> list[str]:
    return with_counts(standin_args, warmups=0, runs=3, extra=("--kv-arms=auto,float16", "-m", "short"))


def test_report_files_and_passing_gate(
    pytester: pytest.Pytester, args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(HOOK)
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit = tmp_path / "junit.xml"
    result = pytester.runpytest_subprocess(*args, "--kv-fail=wall_tps[short]: >= 1", f"--junitxml={junit}")
    assert result.ret == 0, result.stdout.str()
    run = latest(pytester)
    for name in ("report.json", "report.md", "summary.csv", "report.html", "short.png"):
        assert (run / name).is_file(), name
    report = json.loads((run / "report.json").read_text())
    assert report["report_version"] == 1
    assert [a["name"] for a in report["arms"]] == ["auto", "float16"] and report["arms"][0]["baseline"]
    assert report["arms"][1]["resolved"]["cache_dtype"] == "float16"
    assert {d["metric"] for d in report["deltas"]} == {"wall_tps", "decode_tps", "ttft_s"}
    assert all(d["arm"] == "float16" and d["verdict"] in ("better", "worse", "inconclusive") for d in report["deltas"])
    assert all(g["outcome"] == "pass" for g in report["gates"]) and len(report["gates"]) == 4
    md = (run / "report.md").read_text()
    assert "| Metric | auto | float16 | float16 delta |" in md and "## Short-context probes" in md
    assert "data:image/png;base64," in (run / "report.html").read_text()
    result.stdout.fnmatch_lines(
        [
            "A/B (ratio of means*",
            "Short-context probes:",
            "*float16 delta*",
            "gate PASS: wall_tps[[]short@code]: >= 1 (auto)*",
            "report: *report.md*",
        ]
    )
    text = summary.read_text()  # the gates first, then report.md
    assert text.startswith("## pytest-kvcache gates: 4 PASS\n") and text.endswith(md)
    calls = (pytester.path / "hook-calls.jsonl").read_text().splitlines()
    assert len(calls) == 1 and json.loads(calls[0])["arms"] == ["auto", "float16"]
    xml = junit.read_text()
    assert 'name="kv_arm" value="float16"' in xml and 'name="kv_decode_tps_mean"' in xml


def test_failing_gate_exits_1_with_its_numbers(pytester: pytest.Pytester, args: list[str]) -> None:
    """Three boots per arm: the CI is over boots and a gate outside it fails."""
    gate = "--kv-fail=wall_tps[short@code]: float16 >= auto * 50"
    result = pytester.runpytest_subprocess(*args, "--kv-replicates=3", gate)
    assert result.ret == 1
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines(
        [
            "gate FAIL: wall_tps[[]short@code]: float16 >= auto * 50 (float16/auto) — value *× deciding CI [[]*×, *×], "
            "needs >= 50.000× — CI over boots (boots 3 and 3: t-interval)",
            "1 gate(s) failed: exit code 1",
        ]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    (judged,) = json.loads((latest(pytester) / "report.json").read_text())["gates"]
    assert judged["ci_method"] == "boots" and judged["evidence"]["kind"] == "boots"


def test_a_gate_missed_fifty_fold_fails_on_one_boot_per_arm(pytester: pytest.Pytester, args: list[str]) -> None:
    """One boot per arm: the within-boot CI widened by the default boot-to-boot band still lies far below
    50×, so the gate fails without more boots (and says what decided it)."""
    gate = "--kv-fail=wall_tps[short@code]: float16 >= auto * 50"
    result = pytester.runpytest_subprocess(*args, gate)
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "gate FAIL: wall_tps[[]short@code]: float16 >= auto * 50 (float16/auto) — value *× deciding CI *, "
            "needs >= 50.000× — within-boot CI (boots 1 and 1) widened by the default CPU decode rate band*",
            "1 gate(s) failed: exit code 1",
        ]
    )
    report = json.loads((latest(pytester) / "report.json").read_text())
    assert report["gates"][0]["evidence"]["kind"] == "default band"
    assert report["ci"]["boots_per_arm"] == {"auto": 1, "float16": 1}


def test_inconclusive_gate_warns_or_fails(pytester: pytest.Pytester, args: list[str]) -> None:
    assert pytester.runpytest_subprocess(*args).ret == 0
    run = latest(pytester)
    delta = next(
        d
        for d in json.loads((run / "report.json").read_text())["deltas"]
        if d["point"] == "code" and d["metric"] == "wall_tps"
    )
    assert delta["ci_low"] < delta["ratio"] < delta["ci_high"]
    gate = f"--kv-fail=wall_tps[short@code]: float16 >= auto * {delta['ratio']:.6f}"  # inside the CI
    warn = pytester.runpytest_subprocess(f"--kv-rerender={run}", gate)
    assert warn.ret == 0
    warn.stdout.fnmatch_lines(["gate INCONCLUSIVE: wall_tps[[]short@code]*"])
    fail = pytester.runpytest_subprocess(f"--kv-rerender={run}", gate, "--kv-inconclusive=fail")
    assert fail.ret == 1


def test_malformed_gate_exits_4_before_anything_boots(pytester: pytest.Pytester, args: list[str]) -> None:
    result = pytester.runpytest_subprocess(*args, "--kv-fail=decode_tps[short]: >= fast")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-kvcache: --kv-fail: gate *: cannot read the condition '>= fast'*"])
    assert not (pytester.path / ".kvcache").exists()


def test_unknown_arm_in_gate_lists_the_arms(pytester: pytest.Pytester, args: list[str]) -> None:
    result = pytester.runpytest_subprocess(*args, "--kv-fail=decode_tps[short]: int8 >= auto")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown arm 'int8'; arms: auto, float16*"])


def test_save_then_compare_round_trips(pytester: pytest.Pytester, args: list[str]) -> None:
    first = pytester.runpytest_subprocess(*args, "--kv-save=nightly")
    assert first.ret == 0
    stored = pytester.path / ".local" / "share" / "pytest-kvcache" / "baselines" / "nightly"  # the store, under HOME
    assert (stored / "report.json").is_file() and (stored / "requests.jsonl").is_file()
    second = pytester.runpytest_subprocess(*args, "--kv-compare=nightly", "--kv-fail=wall_tps[short]: >= saved * 0.01")
    assert second.ret == 0, second.stdout.str()
    second.stdout.fnmatch_lines(
        [
            "against stored run *",
            "*auto short@code wall_tps: *",
            "gate PASS: wall_tps[[]short@code]: >= saved * 0.01 (auto/saved)*widened by the default CPU*",
        ]
    )
    report = json.loads((latest(pytester) / "report.json").read_text())
    assert report["compare"]["baseline_run"] == json.loads((stored / "report.json").read_text())["run_id"]


def test_compare_with_a_missing_baseline_is_a_usage_error(pytester: pytest.Pytester, args: list[str]) -> None:
    result = pytester.runpytest_subprocess(*args, "--kv-compare=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--kv-compare: no stored baseline 'nope' in *baselines (store one with --kv-save=NAME)"]
    )


def test_a_stored_run_rerenders_identically(pytester: pytest.Pytester, args: list[str], tmp_path: Path) -> None:
    gate = "--kv-fail=ttft_s[short]: <= +1000%"
    assert pytester.runpytest_subprocess(*args, gate).ret == 0
    stored = tmp_path / "stored-run"
    shutil.copytree(latest(pytester), stored)
    before = {n: (stored / n).read_bytes() for n in ("report.json", "report.md", "summary.csv")}
    for name in before:
        (stored / name).unlink()
    result = pytester.runpytest_subprocess(f"--kv-rerender={stored}", gate)
    assert result.ret == 0, result.stdout.str()
    assert {n: (stored / n).read_bytes() for n in before} == before
    result.stdout.fnmatch_lines(
        ["report of *: report.json, report.md, summary.csv, report.html, short.png", "gate *: ttft_s[[]short@*"]
    )
    failing = pytester.runpytest_subprocess(f"--kv-rerender={stored}", "--kv-fail=wall_tps[short]: >= 1000000")
    assert failing.ret == 1


def test_rerender_of_an_incomplete_folder_says_what_is_missing(pytester: pytest.Pytester, tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    result = pytester.runpytest_subprocess(f"--kv-rerender={tmp_path / 'run'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(["ERROR: pytest-kvcache: *run: incomplete run folder — missing requests.jsonl"])


def test_probes_feed_pytest_benchmark(pytester: pytest.Pytester, args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = pytester.runpytest_subprocess(*args, f"--benchmark-json={out}")
    assert result.ret == 0, result.stdout.str()
    benchmarks = json.loads(out.read_text())["benchmarks"]
    assert sorted(b["name"] for b in benchmarks) == sorted(
        f"test_short[{arm}-{shape}]" for arm in ("auto", "float16") for shape in ("narrative", "code")
    )
    for b in benchmarks:
        assert b["stats"]["rounds"] == 3  # one pedantic round per measured request
        assert b["extra_info"]["valid_samples"] == 3 and b["extra_info"]["wall_tps_mean"] > 0
    machine = json.loads((latest(pytester) / "run.json").read_text())["benchmark_machine_info"]
    assert machine["machine"]["python_version"]


@pytest.mark.parametrize("flag", ["--benchmark-skip", "--benchmark-disable", "--benchmark-only"])
def test_benchmark_flags_never_skip_or_void_probes(pytester: pytest.Pytester, args: list[str], flag: str) -> None:
    result = pytester.runpytest_subprocess(*args, flag)
    result.assert_outcomes(passed=4)
    records = read_records(latest(pytester) / "requests.jsonl")
    assert len([r for r in records if r["phase"] == "measured"]) == 12
