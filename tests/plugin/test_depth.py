"""Depth probes through pytest on the stand-in engine (its /tokenize and usage count words)."""

from __future__ import annotations

import json

import pytest

from pytest_kvcache.run.folder import read_records

ARMS = """
[tool.pytest_kvcache.arms.notok]
args = ["--standin-no-tokenize"]
"""


def records(pytester: pytest.Pytester) -> list[dict]:
    return read_records(pytester.path / ".kvcache" / "runs" / "latest" / "requests.jsonl")


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ("short", {"test_short"}),
        ("depth", {"test_prefill", "test_agentic"}),
        ("prefill", {"test_prefill"}),
        ("agentic", {"test_agentic"}),
        ("short or depth", {"test_short", "test_prefill", "test_agentic"}),
    ],
)
def test_markers_select_exactly_their_probes(pytester: pytest.Pytester, marker: str, expected: set[str]) -> None:
    result = pytester.runpytest("--collect-only", "-q", "--kv-arms=auto,float16", "--kv-depths=2k,8k", "-m", marker)
    names = {line.split("::")[1].split("[")[0] for line in result.stdout.lines if "::" in line}
    assert names == expected


def test_depth_ids_and_order(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        "--collect-only", "-q", "--kv-arms=bfloat16", "--kv-depths=2k,12500", "-m", "depth", "--kv-sessions=3"
    )
    ids = [line.split("::")[1] for line in result.stdout.lines if "::" in line]
    assert ids == [
        "test_prefill[bfloat16-2k]",
        "test_prefill[bfloat16-12500]",
        "test_agentic[bfloat16-s1]",
        "test_agentic[bfloat16-s2]",
        "test_agentic[bfloat16-s3]",
    ]


@pytest.mark.parametrize("depths", ["2k,,8k", "ten", "2k,2k", "10"])
def test_malformed_depths_are_usage_errors(pytester: pytest.Pytester, depths: str) -> None:
    result = pytester.runpytest("--kv-arms=auto", f"--kv-depths={depths}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-kvcache: --kv-depths: *"])


def test_prefill_on_standin_is_exact_and_cold(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    result = pytester.runpytest_subprocess("--kv-arms=auto", *standin_args, "-m", "prefill", "--kv-depths=500,3k")
    result.assert_outcomes(passed=2)
    prefill = records(pytester)
    assert len(prefill) == 2 * (1 + 3)
    for r in prefill:
        assert r["sample"]["prompt_tokens"] <= r["depth"] and r["sample"]["prompt_tokens"] >= 0.99 * r["depth"]
        assert r["cold_proof"] == "metrics" and r["sizing"]["method"] == "tokenize"
    result.stdout.fnmatch_lines(["Fresh-prefill probes (measured samples*", "*500*prefill_tps*auto*3*"])


def test_prefill_without_tokenize_falls_back_to_calibration(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    pytester.makepyprojecttoml(ARMS)
    result = pytester.runpytest_subprocess("--kv-arms=notok", *standin_args, "-m", "prefill", "--kv-depths=500")
    result.assert_outcomes(passed=1)
    assert {r["sizing"]["method"] for r in records(pytester)} == {"calibrated"}
    evidence = json.loads((pytester.path / ".kvcache/runs/latest/arms/notok/evidence.json").read_text())
    assert "prefill sized by calibration" in evidence["tokenize"]


def test_an_explicit_depth_over_the_engines_max_model_len_fails_the_boot_before_any_request(
    pytester: pytest.Pytester, standin_args: list[str]
) -> None:
    """The tiny model's config allows 131,072 tokens, but the engine serves 8,192: --kv-depths=9k cannot fit,
    and the first boot says so before any request — never a silent skip and a green run."""
    result = pytester.runpytest_subprocess("--kv-arms=auto", *standin_args, "-m", "prefill", "--kv-depths=9k", "-rs")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*--kv-depths: 9k + 16 output tokens cannot fit the context of 8,192 tokens (max_model_len of auto's engine)*"]
    )
    assert not read_records(pytester.path / ".kvcache" / "runs" / "latest" / "requests.jsonl")


def test_a_default_depth_over_the_engines_max_model_len_is_left_out_and_said(
    pytester: pytest.Pytester, standin_args: list[str]
) -> None:
    result = pytester.runpytest_subprocess(
        "--kv-arms=auto",
        *standin_args,
        "-m",
        "prefill",
        "--kv-engine-args=--max-model-len 6000 " + standin_args[1].split("=", 1)[1],
        "-rs",
    )
    result.stdout.fnmatch_lines(["*prefill@16k: left out, 16,000 + 16 tokens exceed the context of 6,000 tokens*"])
    result.assert_outcomes(passed=1)  # 4k; 16k was left out of the plan before any boot
    assert "left out" in (pytester.path / ".kvcache" / "runs" / "latest" / "report.md").read_text()


def test_agentic_replay_on_standin(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    result = pytester.runpytest_subprocess(
        "--kv-arms=auto,float16",
        *standin_args,
        "-m",
        "agentic",
        "--kv-sessions=2",
        "--kv-turns=3",
        "--kv-agentic-max-tokens=8",
        "--kv-engine-args=--max-model-len 100000",
    )
    result.assert_outcomes(passed=4)
    agentic = records(pytester)
    assert [(r["arm"], r["session"], r["turn"]) for r in agentic[:3]] == [
        ("auto", 1, 1),
        ("auto", 1, 2),
        ("auto", 1, 3),
    ]
    by_key = {(r["arm"], r["session"], r["turn"]): r["prompt_sha256"] for r in agentic}
    assert all(by_key[("float16", s, t)] == by_key[("auto", s, t)] for (_, s, t) in by_key)
    assert by_key[("auto", 1, 1)] != by_key[("auto", 2, 1)]
    result.stdout.fnmatch_lines(
        ["agentic decode-at-depth*", "*Turn*Prompt tokens*auto TTFT*float16 TTFT*", "*auto: TTFT grew*"]
    )


def test_agentic_live_mode_counts_misses(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    # The stand-in never calls tools: every live turn is a miss and the fixture's call is synthesized.
    result = pytester.runpytest_subprocess(
        "--kv-arms=auto", *standin_args, "-m", "agentic", "--kv-turns=2", "--kv-sessions=1", "--kv-agentic-mode=live"
    )
    result.assert_outcomes(passed=1)
    agentic = records(pytester)
    assert [r["tool_call_miss"] for r in agentic] == [True, True]
    assert all(r["shape"] == "live" for r in agentic)
