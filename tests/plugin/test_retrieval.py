"""The retrieval probe through the plugin on the stand-in engine (issue 44): its cells are planned and said,
every needle is asked at its exact depth with the same needles in every arm, each one's expected and returned
text is kept, and a gate on a depth the baseline cannot judge (the stand-in copies nothing) is an error that
fails the run with the reason — never a PASS. The statistics are proved in tests/unit/test_retrieval_report.py;
the real engine in tests/engine/test_llamacpp.py."""

from __future__ import annotations

import json

import pytest

from tests.plugin.conftest import latest

ARGS = ("-m", "retrieval", "--kv-retrieval-depths=300", "--kv-retrieval-needles=2", "--kv-retrieval-positions=10,90")


def _run(pytester: pytest.Pytester, standin_args: list[str], *extra: str) -> pytest.RunResult:
    args = [a for a in standin_args if a not in ("-m", "short")]
    return pytester.runpytest_subprocess(*args, "--kv-arms=auto,fp8", *ARGS, *extra)


def test_retrieval_asks_the_same_needles_at_the_exact_depth_in_every_arm(
    pytester: pytest.Pytester, standin_args: list[str]
) -> None:
    result = _run(pytester, standin_args)
    out = result.stdout.str()
    assert result.ret == 0, out[-4000:]
    assert "retrieval: recall (a completion ending with the needle's lead-in)" in out
    assert "2 cells of 2 needle(s), 4 requests an arm" in out
    folder = latest(pytester)
    lines = [json.loads(line) for line in (folder / "retrieval.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 2 * 2
    assert all(r["ok"] and r["prompt_tokens"] == 300 and r["expected"] and "returned" in r for r in lines)
    asked = {
        arm: [(r["position"], r["needle"], r["key"], r["expected"]) for r in lines if r["arm"] == arm]
        for arm in ("auto", "fp8")
    }
    assert asked["auto"] == asked["fp8"]
    report = json.loads((folder / "report.json").read_text())
    assert {c["arm"] for c in report["retrieval"]["cells"]} == {"auto", "fp8"}
    assert all(c["ceiling"] for c in report["retrieval"]["cells"] if c["arm"] == "auto")  # it copies nothing
    assert "## Retrieval at depth" in (folder / "report.md").read_text()


def test_a_retrieval_gate_where_the_baseline_cannot_judge_is_an_error(
    pytester: pytest.Pytester, standin_args: list[str]
) -> None:
    gate = "--kv-fail=retrieval_acc[retrieval@300]: fp8 >= auto - 0.05"
    result = _run(pytester, standin_args, gate, "--kv-max-replicates=1")
    out = result.stdout.str()
    assert result.ret == 1, out[-4000:]
    (found,) = json.loads((latest(pytester) / "report.json").read_text())["gates"]
    assert found["outcome"] == "error" and "cannot judge" in found["reason"], found


def test_the_multi_key_variant_asks_one_of_its_needles(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    """Two key counts on one boot: each is its own cell, beside the single needle, in the same test."""
    result = _run(pytester, standin_args, "--kv-retrieval-keys=1,3", "--kv-retrieval-haystack=filler")
    out = result.stdout.str()
    assert result.ret == 0, out[-4000:]
    assert "one needle a haystack and 3 needles a haystack with distinct keys, one asked, in filler" in out
    lines = [json.loads(line) for line in (latest(pytester) / "retrieval.jsonl").read_text().splitlines()]
    assert sorted({r["keys"] for r in lines}) == [1, 3] and {r["haystack"] for r in lines} == {"filler"}
    assert all(r["ok"] and r["prompt_tokens"] == 300 for r in lines)
    assert len([r for r in lines if r["arm"] == "auto"]) == 2 * 2 * 2  # keys × positions × needles
    cells = json.loads((latest(pytester) / "report.json").read_text())["retrieval"]["cells"]
    assert sorted({c["keys"] for c in cells}) == [1, 3]


def test_a_needle_may_take_its_prompts_first_token_limit_not_only_the_stall_timeout(
    pytester: pytest.Pytester, standin_args: list[str], tag: str
) -> None:
    """A retrieval request is not streamed: nothing arrives until its prefill ends. An engine slower than the stall
    timeout per request (llama.cpp's q4_0 KV at 4k on a busy 2-core host: over 2 minutes) still answers within the
    first-token limit of a prompt of that depth (--kv-first-token-floor + tokens / --kv-min-prefill-tps)."""
    slow = [a for a in standin_args if not a.startswith("--kv-engine-args")]
    slow.append(f"--kv-engine-args={tag} --standin-unstreamed-delay=1.5")
    result = _run(pytester, slow, "--kv-stall-timeout=1", "--kv-first-token-floor=10")
    out = result.stdout.str()
    assert result.ret == 0, out[-4000:]
    lines = [json.loads(line) for line in (latest(pytester) / "retrieval.jsonl").read_text().splitlines()]
    assert len(lines) == 8 and all(r["ok"] and r["wall_s"] >= 1.5 for r in lines), lines
