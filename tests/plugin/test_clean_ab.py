"""Replicated ABBA boots, confound refusal, the A/A noise band and adaptive rounds, through pytest on the
stand-in engine (real vLLM runs the same paths in tests/engine)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from pytest_kvcache.run.folder import read_records
from tests.plugin.conftest import latest, with_counts


def report_of(pytester: pytest.Pytester) -> dict[str, Any]:
    return json.loads((latest(pytester) / "report.json").read_text())


@pytest.fixture
def args(standin_args: list[str]) -> list[str]:
    return with_counts(standin_args, warmups=0, runs=3, extra=("-k", "code"))


def test_two_replicates_boot_abba_and_the_report_shows_each_boot(pytester: pytest.Pytester, args: list[str]) -> None:
    result = pytester.runpytest_subprocess(*args, "--kv-arms=auto,float16", "--kv-replicates=2", "-v")
    assert result.ret == 0, result.stdout.str()
    ran = re.findall(r"test_short\[(\S+?)-code\] PASSED", result.stdout.str())
    assert ran == ["auto.r1", "float16.r1", "float16.r2", "auto.r2"]
    result.stdout.fnmatch_lines(["*order abba*", "*1. auto.r1 (baseline)*", "*3. float16.r2*"])
    run = latest(pytester)
    assert sorted(p.name for p in (run / "arms").iterdir()) == ["auto.r1", "auto.r2", "float16.r1", "float16.r2"]
    started = {b: json.loads((run / "arms" / b / "evidence.json").read_text())["started_unix_s"] for b in ran}
    assert sorted(started, key=started.__getitem__) == ran  # booted in that order, one at a time
    assert {(r["boot"], r["replicate"]) for r in read_records(run / "requests.jsonl")} == {
        ("auto.r1", 1),
        ("float16.r1", 1),
        ("float16.r2", 2),
        ("auto.r2", 2),
    }
    report = report_of(pytester)
    assert [b["boot"] for b in report["boots"]] == ran and report["ci"]["order"] == ran
    assert report["ci"]["method"] == "within-boot" and "within-boot noise only" in report["ci"]["text"]
    assert {r["boot"] for r in report["boot_results"]} == set(ran)
    assert all(d["ci_method"] == "within-boot" and d["boots_arm"] == 2 for d in report["deltas"])
    assert report["confounds"]["status"] == "clean", report["confounds"]
    kinds = {(r["kind"], r["arm"]): r for r in report["agreement"]["rows"]}
    assert set(kinds) == {
        ("between arms", "float16"),
        ("within a boot", "auto"),
        ("within a boot", "float16"),
        ("across boots", "auto"),
        ("across boots", "float16"),
    }
    between = kinds[("between arms", "float16")]
    assert between["pairs"] == 4 and between["identical_share"] == 1.0 and between["mean_abs_logprob_diff"] == 0
    assert len(read_records(run / "agreement.jsonl")) == 8  # 2 requests per boot
    md = (run / "report.md").read_text()
    assert "## Output agreement" in md
    assert "Order: auto.r1 → float16.r1 → float16.r2 → auto.r2" in md
    assert "| # | Boot | Arm | Status | Ready after | short@code decode_tps |" in md


CONFOUNDED_ARM = """
[tool.pytest_kvcache.arms.f16x]
kv_cache_dtype = "float16"
args = ["--max-num-seqs", "4"]
knobs = ["kv_cache_dtype"]
"""


def test_an_undeclared_engine_arg_makes_the_ab_confounded_and_exit_1(
    pytester: pytest.Pytester, args: list[str]
) -> None:
    pytester.makepyprojecttoml(CONFOUNDED_ARM)
    result = pytester.runpytest_subprocess(*args, "--kv-arms=auto,f16x")
    assert result.ret == 1, result.stdout.str()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*CONFOUNDED: the boots differ in 1 way(s) the arms do not declare*",
            '*argv.--max-num-seqs: "4" in f16x vs absent in auto*',
            "*the A/B is CONFOUNDED (see above): exit code 1*",
        ]
    )
    report = report_of(pytester)
    assert report["confounds"]["status"] == "CONFOUNDED"
    assert "**CONFOUNDED**" in (latest(pytester) / "report.md").read_text()
    allowed = pytester.runpytest_subprocess(*args, "--kv-arms=auto,f16x", "--kv-allow-diff=argv.--max-num-seqs")
    assert allowed.ret == 0, allowed.stdout.str()
    found = report_of(pytester)["confounds"]
    assert found["status"] == "clean" and found["allowed"][0]["allowed_by"] == "argv.--max-num-seqs"


def test_the_a_a_noise_band_is_saved_and_used_by_gates(pytester: pytest.Pytester, args: list[str]) -> None:
    aa = pytester.runpytest_subprocess(*args, "--kv-arms=auto,auto", "--kv-save=noise")
    assert aa.ret == 0, aa.stdout.str()
    assert [a["name"] for a in report_of(pytester)["arms"]] == ["auto", "auto.2"]
    bad = pytester.runpytest_subprocess(*args, "--kv-arms=auto,float16", "--kv-noise=nope")
    assert bad.ret == 4 and "no stored run 'nope'" in bad.stderr.str()
    result = pytester.runpytest_subprocess(
        *args, "--kv-arms=auto,float16", "--kv-noise=noise", "--kv-fail=wall_tps[short]: >= -50%"
    )
    assert result.ret == 0, result.stdout.str()
    report = report_of(pytester)
    assert report["noise"]["run"] == "noise" and report["noise"]["bands"]
    assert all(d["noise_pct"] is not None for d in report["deltas"])
    # the A/A's spread: σ̂ of its log boot means (auto and auto.2 are one arm: 2 boots, 1 degree of freedom)
    assert (
        "the A/A noise run noise (SD " in report["gates"][0]["reason"]
        and "1 df; --kv-noise)" in report["gates"][0]["reason"]
    )
    assert {b["df"] for b in report["noise"]["bands"]} == {1.0}
    assert report["gates"][0]["evidence"]["kind"] == "noise run" and report["gates"][0]["evidence"]["df"] == 1.0


def test_target_ci_skips_adaptive_rounds_once_narrow_enough(pytester: pytest.Pytester, args: list[str]) -> None:
    result = pytester.runpytest_subprocess(
        *args, "--kv-arms=auto,float16", "--kv-replicates=2", "--kv-target-ci=90", "--kv-max-replicates=3", "-v", "-rs"
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*boot budget: up to 3 boots per arm (--kv-max-replicates; 2 planned): round 3 boot only while a CI is "
            "wider than ±90%",
            "*5. auto.r3*(adaptive: only while a CI is wider than ±90%)*",
        ]
    )
    result.assert_outcomes(passed=4, skipped=2)
    result.stdout.fnmatch_lines(["*adaptive round 3 not booted: target ±90% reached after 2 round(s)*"])
    run = latest(pytester)
    assert not (run / "arms" / "auto.r3").exists()
    sampling = read_records(run / "sampling.jsonl")
    assert [s["decision"] for s in sampling if s["kind"] == "rounds"] == ["skip"]
    assert {s["kind"] for s in sampling} == {"rounds", "requests"}
    report = report_of(pytester)
    assert [b["status"] for b in report["boots"]][-2:] == ["skipped", "skipped"]
    assert "## Sampling" in (run / "report.md").read_text()


def test_target_ci_adds_concurrency_trials_until_narrow_or_capped(
    pytester: pytest.Pytester, standin_args: list[str]
) -> None:
    """The adaptive rule covers the concurrency probe too: trials are added (their aggregate tok/s is the
    sampled value) until the CI is narrow enough or --kv-max-runs caps them."""
    args = [a for a in standin_args if a not in ("-m", "short")]
    result = pytester.runpytest_subprocess(
        *args,
        "--kv-arms=auto",
        "--kv-concurrency=2",
        "--kv-warmups=0",
        "-m",
        "concurrency",
        "--kv-target-ci=0.0001",
        "--kv-max-runs=4",
    )
    assert result.ret == 0, result.stdout.str()
    run = latest(pytester)
    trials = {r["index"] for r in read_records(run / "requests.jsonl") if r["probe"] == "concurrency"}
    assert trials == {0, 1, 2, 3}
    (line,) = [s for s in read_records(run / "sampling.jsonl") if s.get("probe") == "concurrency"]
    assert line["n"] == 4 and line["reason"].startswith("cap reached: 4 trial(s) (--kv-max-runs)")


def test_concurrency_probe_reports_aggregate_and_per_stream_figures(
    pytester: pytest.Pytester, standin_args: list[str]
) -> None:
    args = [a for a in standin_args if a not in ("-m", "short")]
    result = pytester.runpytest_subprocess(
        *args, "--kv-arms=auto,float16", "--kv-concurrency=1,4", "--kv-warmups=0", "-m", "concurrency", "-v"
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*test_concurrency[[]auto-c1[]] PASSED*", "*test_concurrency[[]float16-c4[]] PASSED*"])
    run = latest(pytester)
    recs = [r for r in read_records(run / "requests.jsonl") if r["phase"] == "measured"]
    four = [r for r in recs if r["shape"] == "c4" and r["boot"] == "auto"]
    assert len(four) == 2 * 4 and {r["stream"] for r in four} == {0, 1, 2, 3}
    sends = [r["sample"]["send_unix_s"] for r in four if r["index"] == 0]
    assert max(sends) - min(sends) < 0.5  # released together
    report = report_of(pytester)
    rows = {(s["point"], s["metric"], s["arm"]): s for s in report["summary"] if s["probe"] == "concurrency"}
    assert {m for _, m, _ in rows} == {"aggregate_tps", "stream_tps_median", "ttft_p95_s"}
    assert rows[("c4", "aggregate_tps", "auto")]["n"] == 2
    assert rows[("c4", "aggregate_tps", "auto")]["mean"] > rows[("c1", "aggregate_tps", "auto")]["mean"]
    assert [s["point"] for s in report["summary"] if s["metric"] == "aggregate_tps"][:2] == ["c1", "c1"]
    load = report["client_load"]  # the many-stream client's load, per measured trial
    assert load["trials"] == 2 * 2 * 2 and load["processes_max"] == 1 and 0 < load["cpu_share_max"] < 1
    assert all("client" in r and r["client"]["streams"] == int(r["shape"][1:]) for r in recs)


def test_a_saturated_client_excludes_its_trials_and_says_so(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    """A trial whose many-stream client was saturated is recorded, flagged and kept out of every figure, and the
    report names it and the fix. Saturation is forced here by a CPU bound no process can stay under
    (--kv-client-max-cpu=0.001): the overload itself is tests/unit/test_fanout.py's."""
    args = [a for a in standin_args if a not in ("-m", "short")]
    result = pytester.runpytest_subprocess(
        *args, "--kv-arms=auto", "--kv-concurrency=2", "--kv-warmups=0", "-m", "concurrency",
        "--kv-client-max-cpu=0.001",
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*4 measured sample(s) flagged: client_saturated*"])
    run = latest(pytester)
    recs = [r for r in read_records(run / "requests.jsonl") if r["phase"] == "measured"]
    assert len(recs) == 2 * 2 and all(r["ok"] for r in recs)
    assert all("client_saturated" in r["flags"] for r in recs)
    assert all(r["excluded_reason"].startswith("client_saturated: a client process used") for r in recs)
    assert all(r["client"]["saturated"] and r["client"]["processes"] == 1 for r in recs)
    report = report_of(pytester)
    load = report["client_load"]
    assert load["trials"] == 2 and [s["trial"] for s in load["saturated"]] == [0, 1]
    assert not [s for s in report["summary"] if s["probe"] == "concurrency" and s["n"]]  # no figure from them
    assert "saturated in 2 trial(s)" in (run / "report.md").read_text()
    assert "(--kv-client-procs)" in (run / "report.md").read_text()


def test_self_check_is_in_every_runs_evidence(pytester: pytest.Pytester, args: list[str]) -> None:
    with_check = [a for a in args if a != "--kv-no-self-check"]
    result = pytester.runpytest_subprocess(*with_check, "--kv-arms=auto")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*Measuring-client self-check (quick, * streams of * tokens at ITL 1.00 ms*"])
    run = latest(pytester)
    check = json.loads((run / "selfcheck.json").read_text())
    assert check["n"] >= 3 and not check["failed"] and check["requests"]
    assert check["overhead_per_chunk_s"] > 0 and check["metrics"]["ttft_error_ms"]["median"] is not None
    meta = json.loads((run / "run.json").read_text())
    assert meta["self_check"]["overhead_per_chunk_s"] == check["overhead_per_chunk_s"]
    assert "requests" not in meta["self_check"]
    # the served model's size, for the report's size class (report.bands.unlike_source): here the tiny embedded one
    assert meta["model_size"] == {"parameters": 4_194_304, "source": "estimated from the embedded model's config"}
    report = report_of(pytester)
    assert report["self_check"]["measured_itl_s"] > 0
    share = check["overhead_per_chunk_s"] / report["self_check"]["measured_itl_s"]
    assert bool(report["self_check"]["warnings"]) == (share > 0.02)
    if share > 0.02:
        result.stdout.fnmatch_lines(["*warning: the measuring client spends * µs of CPU per streamed chunk*"])
    off = pytester.runpytest_subprocess(*args, "--kv-arms=auto")
    assert off.ret == 0 and not (latest(pytester) / "selfcheck.json").exists()


DIES_ON_AGREEMENT = """
[tool.pytest_kvcache.arms.fragile]
args = ["--standin-die-after=3"]
"""


def test_an_engine_dying_on_the_agreement_requests_keeps_the_measurements(
    pytester: pytest.Pytester, args: list[str]
) -> None:
    pytester.makepyprojecttoml(DIES_ON_AGREEMENT)
    # 2 measured requests per boot (-k code, no warmups); the 3rd chat request is the first agreement one.
    result = pytester.runpytest_subprocess(*args, "--kv-arms=auto,fragile", "--kv-runs=2")
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=2)
    run = latest(pytester)
    agreed = read_records(run / "agreement.jsonl")
    died = [a for a in agreed if a["boot"] == "fragile"]
    assert len(died) == 1 and not died[0]["ok"]
    assert died[0]["error"] == "the engine died on the agreement requests: RuntimeError: standin died"
    assert len([a for a in agreed if a["boot"] == "auto" and a["ok"]]) == 2
    assert len([r for r in read_records(run / "requests.jsonl") if r["ok"]]) == 4
    report = report_of(pytester)
    assert any("the engine died on the agreement requests" in n for n in report["agreement"]["notes"])
    evidence = json.loads((run / "arms" / "fragile" / "evidence.json").read_text())
    assert "the engine died on the agreement requests: RuntimeError: standin died" in evidence["warnings"]
