"""Judging a built report: the run's seed everywhere, the one exit-code rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_kvcache.report import judge
from pytest_kvcache.report.build import build
from pytest_kvcache.report.gates import GateError
from pytest_kvcache.report.load import RunData
from tests.factories import measured_records


def noisy_run(seed: int) -> RunData:
    rng = np.random.default_rng(1)
    records: list[dict[str, Any]] = []
    for arm, centre in (("a", 100.0), ("b", 104.0)):
        records += measured_records(arm, (float(v) for v in rng.normal(centre, 6.0, 12)), replicate=1)
    meta = {"settings": {"arms": [{"name": "a"}, {"name": "b"}], "seed": seed}, "plan": []}
    return RunData(path=Path("/nonexistent"), meta=meta, records=records)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 7])
def test_a_gate_and_the_report_give_one_ci_for_one_delta(seed: int) -> None:
    run = noisy_run(seed)
    report = build(run)
    done = judge.judge(report, run, ["decode_tps[short@code]: b >= a * 0.9"])
    (delta,) = [d for d in report["deltas"] if d["metric"] == "decode_tps"]
    (gate,) = done.gate_results
    # one boot a side: the gate is judged on the interval the delta's verdict was judged on (the within-boot
    # CI widened by the default band), and says what it widened
    assert [gate["ci_low"], gate["ci_high"]] == delta["judged_ci"]
    assert gate["evidence"]["within_ci"] == [delta["ci_low"], delta["ci_high"]]
    assert report["seed"] == seed


def test_the_seed_moves_the_ci() -> None:
    zero, seven = build(noisy_run(0)), build(noisy_run(7))
    assert zero["deltas"][0]["ci_low"] != seven["deltas"][0]["ci_low"]


def test_a_gate_naming_an_arm_the_run_lacks_is_refused() -> None:
    run = noisy_run(0)
    with pytest.raises(GateError, match="unknown arm 'c'"):
        judge.judge(build(run), run, ["decode_tps[short]: c >= a"])


@pytest.mark.parametrize(
    ("failed", "confounded", "error", "code"),
    [(0, False, None, 0), (1, False, None, 1), (0, True, None, 1), (1, True, "boom", 3), (0, False, "boom", 3)],
)
def test_one_exit_code_rule(failed: int, confounded: bool, error: str | None, code: int) -> None:
    judged = judge.Judgement(confounded=confounded)
    judged.failed_gates = [{"name": "g"}] * failed  # type: ignore[list-item]
    assert judge.exit_code(judged, error) == code


@pytest.mark.parametrize(
    ("pytest_status", "report_status", "combined"),
    [(0, 0, 0), (0, 1, 1), (5, 1, 1), (1, 0, 1), (1, 3, 3), (0, 3, 3), (2, 3, 2), (4, 1, 4), (5, 0, 5)],
)
def test_pytest_and_report_status_combine(pytest_status: int, report_status: int, combined: int) -> None:
    assert judge.combine(pytest_status, report_status) == combined
