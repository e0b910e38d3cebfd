"""Gates at default settings, through pytest on the stand-in engine: a gate missed by far fails with one boot
per arm, an A/A does not fail a 0.97 gate, a gate on its threshold stays undecided and adds boots up to the
budget, and ``--kv-inconclusive=fail`` turns that into exit 1."""

from __future__ import annotations

import json
import re
from typing import Any
from xml.etree import ElementTree

import pytest

from pytest_kvcache.run.folder import read_records
from tests.plugin.conftest import latest


def report_of(pytester: pytest.Pytester) -> dict[str, Any]:
    return json.loads((latest(pytester) / "report.json").read_text())


def test_a_gate_missed_five_fold_fails_with_one_boot_per_arm(
    pytester: pytest.Pytester, standin_args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's example, as a new user types it: the arms measure alike, the gate asks for 5×."""
    summary = pytester.path / "step-summary.md"
    junit = pytester.path / "junit.xml"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = pytester.runpytest_subprocess(
        *standin_args,
        "-k",
        "code",
        "--kv-arms=auto,bfloat16",
        "--kv-fail=decode_tps[short]: bfloat16 >= auto * 5",
        f"--junitxml={junit}",
    )
    assert result.ret == 1, result.stdout.str()
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*boot budget: up to 3 boots per arm (--kv-max-replicates; 1 planned): rounds 2–3 boot only while a gate "
            "is undecided",
            "*gate FAIL: decode_tps[[]short@code]: bfloat16 >= auto * 5 (bfloat16/auto)*widened by the default CPU "
            "decode rate band*",
            "*1 gate(s) failed: exit code 1*",
        ]
    )
    rounds = [r for r in read_records(latest(pytester) / "sampling.jsonl") if r["kind"] == "rounds"]
    assert [(r["round"], r["decision"]) for r in rounds] == [(2, "skip")]
    assert rounds[0]["reason"].startswith("every gate decided after 1 round(s)")
    assert "1 gate(s) failed" in out
    report = report_of(pytester)
    (gate,) = report["gates"]
    assert gate["outcome"] == "fail" and gate["evidence"]["kind"] == "default band"
    assert gate["evidence"]["boots_baseline"] == 1 and gate["evidence"]["boots_arm"] == 1
    assert gate["ci_high"] < 5 and "boots_to_decide" not in gate
    assert [b["status"] for b in report["boots"]] == ["stopped", "stopped", "skipped", "skipped", "skipped", "skipped"]
    # the gate outcome is a JUnit property of the test suite (what --junitxml consumers read)
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    name = "kv_gate decode_tps[short@code]: bfloat16 >= auto * 5 (bfloat16/auto)"
    assert props[name].startswith("FAIL value ") and "needs >= 5.000×" in props[name]
    assert "widened by the default CPU decode rate band" in props[name]
    assert props["kv_gates_failed"] == "1"
    # and in the GitHub step summary, before the report
    text = summary.read_text()
    assert text.startswith("## pytest-kvcache gates: 1 FAIL")
    assert "| FAIL | decode_tps[short@code]: bfloat16 >= auto * 5 (bfloat16/auto) |" in text
    assert "# pytest-kvcache A/B report" in text


def test_an_a_a_run_does_not_fail_a_gate_at_097(pytester: pytest.Pytester, standin_args: list[str]) -> None:
    result = pytester.runpytest_subprocess(
        *standin_args, "-k", "code", "--kv-arms=auto,auto", "--kv-fail=decode_tps[short]: auto.2 >= auto * 0.97"
    )
    assert result.ret == 0, result.stdout.str()
    (gate,) = report_of(pytester)["gates"]
    assert gate["outcome"] in ("pass", "inconclusive"), gate


STEADY_PROBE = """
import pytest

from pytest_kvcache.sample import Sample
from pytest_kvcache.probes.registry import ProbeSpec, register

register(ProbeSpec(name="steady", title="Steady", metrics=("decode_tps",), primary_metric="decode_tps"))

#: decode tok/s per boot (round) of each arm: the arms' boot means mirror each other, so the ratio of their
#: geometric means is exactly 1 at every round and every CI straddles it
LEVEL = {"auto": {1: 100.0, 2: 104.0, 3: 96.0}, "float16": {1: 100.0, 2: 96.0, 3: 104.0}}


def sample(rate: float) -> Sample:
    tokens = 101
    window = (tokens - 1) / rate
    return Sample(ok=True, first_token_s=0.01, last_token_s=0.01 + window, end_s=0.02 + window,
                  completion_tokens=tokens, token_chunks=tokens, first_chunk_tokens=1, token_clock="usage",
                  prompt_tokens=10, chunks=tokens + 1)


@pytest.mark.steady
def test_steady(kv_server, kv_record):
    level = LEVEL[kv_server.boot.arm.name][kv_server.boot.replicate]
    for i, rate in enumerate((level - 1, level, level + 1)):
        kv_record(sample(rate), probe="steady", shape="flat", phase="measured", index=i)
"""


def steady_args(standin_args: list[str]) -> list[str]:
    kept = [a for a in standin_args if a not in ("-m", "short")]
    return [*kept, "-m", "steady", "-p", "no:randomly", "--kv-arms=auto,float16"]


def test_a_gate_on_its_threshold_adds_boots_up_to_the_budget_then_warns(
    pytester: pytest.Pytester, standin_args: list[str]
) -> None:
    """A deterministic probe (its samples are made, not measured) whose arms sit exactly on the gate's
    threshold: undecided at 1, 2 and 3 boots per arm, so both adaptive rounds boot, and at the budget the
    gate warns (--kv-inconclusive=warn, the default)."""
    pytester.makepyfile(test_steady=STEADY_PROBE)
    gate = "--kv-fail=decode_tps[steady]: float16 >= auto * 1.0"
    result = pytester.runpytest_subprocess(*steady_args(standin_args), gate, "-v")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*boot budget: up to 3 boots per arm (--kv-max-replicates; 1 planned): rounds 2–3 boot only while a gate "
            "is undecided",
            "*3. float16.r2*(adaptive: only while a gate is undecided)*",
            "*gate INCONCLUSIVE: decode_tps[[]steady@flat]: float16 >= auto * 1.0 (float16/auto)*CI over boots*",
        ]
    )
    ran = re.findall(r"test_steady\[(\S+?)\] PASSED", result.stdout.str())
    assert ran == ["auto.r1", "float16.r1", "float16.r2", "auto.r2", "auto.r3", "float16.r3"]
    run = latest(pytester)
    rounds = [s for s in read_records(run / "sampling.jsonl") if s["kind"] == "rounds"]
    assert [(s["round"], s["decision"]) for s in rounds] == [(2, "boot"), (3, "boot")]
    assert "gate decode_tps[steady@flat]: float16 >= auto * 1.0 (float16/auto) still undecided" in rounds[0]["reason"]
    report = report_of(pytester)
    (judged,) = report["gates"]
    assert judged["outcome"] == "inconclusive" and judged["evidence"]["kind"] == "boots"
    assert judged["value"] == pytest.approx(1.0) and judged["boots_to_decide"] is None  # exactly on it
    assert report["ci"]["boots_per_arm"] == {"auto": 3, "float16": 3}
    assert "Adaptive boots: 4 of 4 added (boot budget 3 per arm, --kv-max-replicates)" in report["ci"]["text"]
    assert "Adaptive boots: 4 of 4 added" in (run / "report.md").read_text()

    failing = pytester.runpytest_subprocess(*steady_args(standin_args), gate, "--kv-inconclusive=fail")
    assert failing.ret == 1, failing.stdout.str()
    failing.stdout.fnmatch_lines(
        ["*gate INCONCLUSIVE: decode_tps[[]steady@flat]*", "1 gate(s) undecided (--kv-inconclusive=fail): exit code 1"]
    )


REJECTED_PROBE = """
import pytest

from pytest_kvcache.probes.registry import ProbeSpec, register
from pytest_kvcache.probes.short import chat_payload

register(ProbeSpec(name="mixed", title="Mixed prompts", metrics=("decode_tps", "ttft_s"), primary_metric="decode_tps"))

PROMPTS = {"fits": "Name one prime.", "too_long": "word " * 400}


@pytest.mark.mixed
@pytest.mark.parametrize("shape", list(PROMPTS))
def test_mixed(kv_server, kv_client, kv_record, shape):
    payload = chat_payload(kv_server.model, [{"role": "user", "content": PROMPTS[shape]}], "greedy", 8)
    for i in range(2):
        kv_record(kv_client.stream_chat(payload), probe="mixed", shape=shape, phase="measured", index=i)
"""


def test_a_point_whose_every_request_fails_is_in_every_output_and_the_verdict_block(
    pytester: pytest.Pytester, standin_args: list[str]
) -> None:
    """The stand-in refuses prompts over its --max-model-len (HTTP 400, vLLM's message): the "too_long" point
    of a user's probe fails every request in both arms. report.json, report.md, report.html and the terminal
    all say so, the tables show the point as FAILED, and the page's verdict block gives the count in red."""
    pytester.makepyfile(test_mixed=REJECTED_PROBE)
    args = [a for a in standin_args if a not in ("-m", "short") and not a.startswith("--kv-engine-args")]
    tag = next(a for a in standin_args if a.startswith("--kv-engine-args")).split("=", 1)[1]
    result = pytester.runpytest_subprocess(
        *args,
        f"--kv-engine-args={tag} --standin-short-context --max-model-len 200",
        "-m",
        "mixed",
        "-p",
        "no:randomly",
        "--kv-arms=auto,float16",
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*failures and exclusions: 4 of 8 measured request(s) failed — see Failures and exclusions.",
            "*auto mixed: 2 failed (http_error) at too_long; no valid sample left at too_long — first: HTTP 400: "
            "This model's maximum context length is 200 tokens*",
        ]
    )
    run = latest(pytester)
    found = report_of(pytester)["failures"]
    assert (found["failed"], found["excluded"], found["measured"]) == (4, 0, 8)
    assert [(r["arm"], r["kind"], r["count"], r["points_removed"]) for r in found["rows"]] == [
        ("auto", "http_error", 2, ["too_long"]),
        ("float16", "http_error", 2, ["too_long"]),
    ]
    assert "maximum context length is 200 tokens" in found["rows"][0]["first_message"]
    assert [(e["point"], e["arm"], e["requests"]) for e in found["empty_points"]] == [
        ("too_long", "auto", 2),
        ("too_long", "float16", 2),
    ]
    md = (run / "report.md").read_text()
    assert "## Failures and exclusions" in md and "4 of 8 measured request(s) failed" in md
    assert "| auto | mixed | failed | http_error | 2 | too_long | too_long | HTTP 400: This model's" in md
    assert "FAILED (2 of 2: http_error)" in md  # the table's cell, not a missing row
    html = (run / "report.html").read_text()
    verdict = html[html.index('<section id="verdict"') : html.index("</section>")]
    assert '<span id="failed-requests" class="chip bad">4 failed requests</span>' in verdict
    assert "<h2>Failures and exclusions</h2>" in html and "FAILED (2 of 2: http_error)" in html
