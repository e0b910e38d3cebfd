"""The fidelity probe through the plugin (stand-in engine): an A/A arm scores zero drift, an arm whose
prompt logprobs move is reported and gated, the report re-renders from the folder, and an engine without
what the probe needs fails its tests with a headline.

The stand-in's ``--standin-logprob-shift`` is the lossy arm: real vLLM cannot be made to move its logprobs
on cue (on this CPU a float16 KV cache changes none, see tests/engine/test_vllm_cpu.py)."""

from __future__ import annotations

import json

import pytest

from tests.plugin.conftest import latest

LOSSY = """
[tool.pytest_kvcache.arms.lossy]
kv_cache_dtype = "float16"
args = ["--standin-logprob-shift", "0.05"]
"""


@pytest.fixture
def args(standin_args: list[str]) -> list[str]:
    kept = [a for a in standin_args if a not in ("-m", "short")]
    return [*kept, "-m", "fidelity", "--kv-fidelity-depths=256,1k", "--kv-fidelity-window=128"]


def test_an_aa_arm_has_zero_drift_and_a_lossy_arm_is_reported_and_gated(
    pytester: pytest.Pytester, args: list[str]
) -> None:
    pytester.makefile(".toml", pyproject=LOSSY)
    result = pytester.runpytest_subprocess(
        *args,
        "--kv-arms=auto,auto,lossy",
        "--kv-fail=logprob_drift[fidelity]: auto.2 <= 0.0001",
        "--kv-fail=logprob_drift[fidelity@1k]: lossy <= 0.01",
    )
    assert result.ret == 1, result.stdout.str()
    result.assert_outcomes(passed=12)  # fidelity gates alone plan no adaptive rounds: no round 2–3 tests
    result.stdout.fnmatch_lines(
        [
            "kvcache: fidelity@prose auto 1,000 tokens scored in * s (windows at 256, 1k)",  # no rounds: no .rN
            "verdict: auto.2 vs auto: |Δ logprob| 0.000 nats/token at 1k*",
            "verdict: lossy vs auto: |Δ logprob| 0.0* nats/token at 1k (95% CI over 4 texts *), KL ≥ *",
            "gate PASS: logprob_drift[[]fidelity@256]: auto.2 <= 0.0001 (auto.2)*",
            "gate FAIL: logprob_drift[[]fidelity@1k]: lossy <= 0.01 (lossy)*",
        ]
    )
    run = latest(pytester)
    report = json.loads((run / "report.json").read_text())
    rows = {(r["arm"], r["point"]): r for r in report["fidelity"]["rows"] if r["kind"] == "between arms"}
    assert set(rows) == {(a, p) for a in ("auto.2", "lossy") for p in ("256", "1k")}
    assert all(rows[("auto.2", p)]["logprob_drift"] == 0.0 for p in ("256", "1k"))
    # the stand-in's error grows with depth, and the report sees it grow
    assert 0 < rows[("lossy", "256")]["logprob_drift"] < rows[("lossy", "1k")]["logprob_drift"]
    # the four default texts: the CI is over them (3 df), never over boots or blocks
    lossy = rows[("lossy", "1k")]
    assert lossy["positions"] == 512 and lossy["texts"] == 4 and lossy["ci_df"] == 3
    assert lossy["ci_basis"] == "over texts" and lossy["per_text"].keys() == {"prose", "code", "data", "markup"}
    assert report["fidelity"]["config"]["texts"].keys() == {"prose", "code", "data", "markup"}
    gates = {g["name"]: g for g in report["gates"]}
    assert {g["evidence"]["kind"] for g in gates.values()} == {"texts"} and all(
        g["ci_method"] == "texts" for g in gates.values()
    )
    assert not [d for d in report["deltas"] if d["probe"] == "fidelity"]  # no ratio against a baseline of zeros
    md = (run / "report.md").read_text()
    assert "## Fidelity at depth" in md and "| between arms | lossy | auto | 1k | 4 × 1 | 512 |" in md
    assert (run / "fidelity.png").is_file() and len((run / "fidelity.jsonl").read_text().splitlines()) == 12
    again = pytester.runpytest_subprocess(f"--kv-rerender={run}", "--kv-fail=kl_topk[fidelity@1k]: lossy <= 1")
    assert again.ret == 0, again.stdout.str()
    assert json.loads((run / "report.json").read_text())["fidelity"]["rows"] == report["fidelity"]["rows"]


def test_an_engine_without_tokenize_fails_the_fidelity_tests_with_a_headline(
    pytester: pytest.Pytester, args: list[str], tag: str
) -> None:
    kept = [a for a in args if not a.startswith("--kv-engine-args")]
    result = pytester.runpytest_subprocess(*kept, "--kv-arms=auto", f"--kv-engine-args={tag} --standin-no-tokenize")
    assert result.ret == 1, result.stdout.str()
    result.assert_outcomes(failed=4)  # one test per text
    result.stdout.fnmatch_lines(
        ["*fidelity prose on auto: the fidelity probe needs the engine's /tokenize for token ids: HTTP 404*"]
    )
    assert "Traceback" not in result.stdout.str()
