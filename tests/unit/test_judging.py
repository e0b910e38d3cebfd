"""Can the baseline judge quality? (probes/judging.py, report/judging.py): each check fails on the case it is for
and passes a working model's figures."""

from __future__ import annotations

import math
from typing import Any

from pytest_kvcache.model.records import FidelityRecord
from pytest_kvcache.probes import judging
from pytest_kvcache.report import judging as report_judging

PROSE = (
    "The committee met on Tuesday to review the budget for the coming year. Several members asked whether the "
    "new library wing could be finished before the winter, and the architect said it could."
)


def test_a_short_loop_is_a_repeat_and_prose_is_not() -> None:
    assert judging.repeat_period("<sT>aT>e\n" * 12) == 9  # the converted Gemma's greedy output
    assert judging.repeat_period("ab" * 40) == 2
    assert judging.repeat_period(PROSE) is None
    code = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"
    assert judging.repeat_period(code) is None
    # a sentence looped (a period beyond MAX_PERIOD) is a small model's habit, not a broken one
    assert judging.repeat_period("The cat sat on the mat by the door. " * 4) is None
    # the stand-in's " tok0 tok1 …" counts up: not a repeat
    assert judging.repeat_period("".join(f" tok{k}" for k in range(48))) is None


def test_each_check_names_its_problem() -> None:
    good = judging.Check(nll=2.6, vocab=49152, chars_per_token=3.9, greedy=[PROSE])
    assert good.problems() == [] and good.unchecked() == []
    chance = judging.Check(nll=8.3, vocab=4096, chars_per_token=3.9, greedy=[])
    (why,) = chance.problems()
    assert "NLL is 8.30 nats/token, 100% of ln(vocabulary 4,096) = 8.32: chance-like" in why
    assert chance.unchecked() == ["greedy repeats (no continuation of 48+ characters)"]
    # the converted Gemma-3-270M of issue 41: NLL 8.0 of ln(262,144) = 12.5 (64%), 24 tokens for 24 characters
    gemma = judging.Check(nll=8.0, vocab=262144, chars_per_token=1.0, greedy=["<sT>aT>e\n" * 8])
    problems = gemma.problems()
    assert len(problems) == 3 and "1.00 characters a token" in problems[1] and "9-character pattern" in problems[2]
    unknown = judging.Check(nll=2.0, vocab=None, chars_per_token=None, greedy=["short"])
    assert unknown.problems() == [] and unknown.unchecked()[0] == "NLL against chance (vocabulary size unknown)"


def _record(arm: str, logprob: float, **extra: Any) -> FidelityRecord:
    window = {"depth": 64, "start": 1, "ids": [1] * 63, "logprob": [logprob] * 63, "top_ids": [], "top_logprobs": []}
    record: dict[str, Any] = {"arm": arm, "text": "prose", "ok": True, "windows": [window], **extra}
    return record  # type: ignore[return-value]


def test_the_report_judges_the_baseline_arm_only() -> None:
    figures = {"vocab_size": 4096, "text_chars": 4000, "text_tokens": 1000, "greedy_text": PROSE}
    chance = -math.log(4096)
    found = report_judging.check([_record("auto", chance, **figures), _record("fp8", -1.0, **figures)], ["auto", "fp8"])
    assert found is not None and not found["can_judge"] and found["nll_share"] == 1.0
    assert found["chars_per_token"] == 4.0
    reason = report_judging.reason(found)
    assert reason is not None and reason.startswith("the baseline auto cannot judge quality: its NLL is 8.32")
    (line,) = report_judging.lines(found)
    assert "**cannot judge quality**" in line and "Quality gates end as errors." in line
    fine = report_judging.check([_record("auto", -2.0, **figures)], ["auto", "fp8"])
    assert fine is not None and fine["can_judge"] and report_judging.reason(fine) is None
    assert report_judging.lines(fine)[0].endswith("can judge quality.")
    assert report_judging.check([], ["auto"]) is None  # no quality probe ran: nothing said
    # a stored run from before the check (no vocabulary, no greedy text): nothing established, no error
    old = report_judging.check([_record("auto", -8.5)], ["auto", "fp8"])
    assert old is not None and old["can_judge"] is None and report_judging.reason(old) is None
    assert (
        "whether it can judge quality is not established. Not checked: NLL against chance"
        in report_judging.lines(old)[0]
    )
